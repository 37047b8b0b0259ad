// The dashboard (placeholder: the page is written in its own branch).
