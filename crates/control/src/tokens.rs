//! Named API tokens with scopes (`flotilla token create`): who may change what.
//!
//! A token has a name (recorded in every change it makes), scopes and optionally the
//! apps it is limited to. The tokens file (TOML, `[[token]]` tables) keeps only each
//! token's SHA-256, so reading the file does not give a token away; it is written by
//! `POST /v1/tokens` and may be edited by hand, and a running process reads it again
//! every few seconds and on SIGHUP. A file that does not load (an unknown scope, a
//! malformed hash) is refused whole and the previous book stays in force. The API's
//! single token of old (`api-token`) is the `admin` scope, so one-token setups work as
//! they did.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use axum::http::{HeaderMap, header};
use serde::{Deserialize, Serialize};

/// What a token may do. Every token may read; `admin` may do everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Every GET (reads are open unless the API is told otherwise; a token with only
    /// this scope proves who reads, e.g. through a name `--allowed-host` does not list).
    Read,
    /// Scale, drain, cordon, demand, overrides, rollback, pool bounds and floors.
    Operate,
    /// Apply and plan specs, named policies; sees secret env values in specs.
    Deploy,
    /// Tokens, scheduler registrations, pool autoscaler reports; everything else too.
    Admin,
}

impl Scope {
    pub const ALL: [Scope; 4] = [Scope::Read, Scope::Operate, Scope::Deploy, Scope::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Operate => "operate",
            Scope::Deploy => "deploy",
            Scope::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Result<Scope, String> {
        Scope::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| format!("unknown scope {s:?} (read, operate, deploy or admin)"))
    }
}

/// What one token is allowed: its name, scopes and the apps it is limited to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Grant {
    pub name: String,
    pub scopes: BTreeSet<Scope>,
    /// `None`: every app, and what belongs to no app (nodes, pools, policies).
    pub apps: Option<BTreeSet<String>>,
}

/// The name the API's single token of old goes by.
pub const API_TOKEN_NAME: &str = "api-token";

impl Grant {
    pub fn admin(name: &str) -> Grant {
        Grant { name: name.to_string(), scopes: BTreeSet::from([Scope::Admin]), apps: None }
    }

    pub fn has(&self, scope: Scope) -> bool {
        scope == Scope::Read || self.scopes.contains(&Scope::Admin) || self.scopes.contains(&scope)
    }

    /// Why this grant may not do what needs `scope` (on `app`, when the call is about
    /// one); `None` when it may.
    pub fn refuses(&self, scope: Scope, app: Option<&str>) -> Option<String> {
        if scope == Scope::Read {
            // Reading changes nothing: an app limit limits what a token changes.
            return None;
        }
        if !self.has(scope) {
            let held: Vec<&str> = self.scopes.iter().map(|s| s.as_str()).collect();
            return Some(format!(
                "token {:?} lacks the {} scope (it has {})",
                self.name,
                scope.as_str(),
                held.join(", ")
            ));
        }
        self.app_limit(app, "change")
    }

    /// Why this grant may not `verb` what belongs to `app` (or to no app): its app list.
    pub fn app_limit(&self, app: Option<&str>, verb: &str) -> Option<String> {
        match (&self.apps, app) {
            (None, _) => None,
            (Some(apps), Some(app)) if apps.contains(app) => None,
            (Some(apps), Some(app)) => Some(format!(
                "token {:?} is limited to apps {} and may not {verb} {app:?}",
                self.name,
                apps.iter().cloned().collect::<Vec<_>>().join(", ")
            )),
            (Some(_), None) => Some(format!(
                "token {:?} is limited to some apps and may not {verb} what belongs to none (nodes, pools, policies)",
                self.name
            )),
        }
    }
}

/// One `[[token]]` of the file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    pub name: String,
    pub scopes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apps: Option<Vec<String>>,
    /// Hex SHA-256 of the token.
    pub sha256: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    #[serde(default)]
    token: Vec<TokenEntry>,
}

/// At most this many named tokens.
pub const MAX_TOKENS: usize = 1_000;

/// The tokens in force, by the hash of each.
#[derive(Debug, Default)]
pub struct TokenBook {
    entries: Vec<TokenEntry>,
    by_hash: HashMap<[u8; 32], Arc<Grant>>,
}

impl TokenBook {
    /// Reads a tokens file; every problem is named, and any one refuses the whole file.
    pub fn parse(text: &str) -> Result<TokenBook, String> {
        let file: TokenFile = toml::from_str(text).map_err(|e| e.to_string().trim().to_string())?;
        Self::from_entries(file.token)
    }

    fn from_entries(entries: Vec<TokenEntry>) -> Result<TokenBook, String> {
        let mut problems = Vec::new();
        if entries.len() > MAX_TOKENS {
            problems.push(format!("{} tokens (at most {MAX_TOKENS})", entries.len()));
        }
        let mut by_hash = HashMap::new();
        let mut names = BTreeSet::new();
        for (i, e) in entries.iter().enumerate() {
            let at = format!("token[{i}] ({:?})", e.name);
            if let Err(why) = check_name(&e.name) {
                problems.push(format!("{at}: name {why}"));
            }
            if e.name == API_TOKEN_NAME || !names.insert(e.name.clone()) {
                problems.push(format!("{at}: the name is taken"));
            }
            let mut scopes = BTreeSet::new();
            for s in &e.scopes {
                match Scope::parse(s) {
                    Ok(s) => {
                        scopes.insert(s);
                    }
                    Err(why) => problems.push(format!("{at}: {why}")),
                }
            }
            if e.scopes.is_empty() {
                problems.push(format!("{at}: no scope (read, operate, deploy or admin)"));
            }
            if let Some(apps) = &e.apps {
                if apps.is_empty() || apps.len() > 1_000 {
                    problems.push(format!("{at}: apps must list 1 to 1,000 apps, or be left out for every app"));
                }
                for a in apps.iter().filter(|a| !flotilla_core::is_name(a)) {
                    problems.push(format!("{at}: app {a:?} is not an app name (1-63 of [a-z0-9-])"));
                }
            }
            let Some(hash) = parse_hex(&e.sha256) else {
                problems.push(format!("{at}: sha256 must be 64 hex digits (the token's SHA-256)"));
                continue;
            };
            let apps = e.apps.as_ref().map(|a| a.iter().cloned().collect());
            if by_hash.insert(hash, Arc::new(Grant { name: e.name.clone(), scopes, apps })).is_some() {
                problems.push(format!("{at}: the same token as another entry"));
            }
        }
        if problems.is_empty() { Ok(TokenBook { entries, by_hash }) } else { Err(problems.join("; ")) }
    }

    pub fn find(&self, token: &str) -> Option<Arc<Grant>> {
        self.by_hash.get(&sha256(token)).cloned()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The tokens without their hashes, for `GET /v1/tokens`.
    pub fn grants(&self) -> Vec<Arc<Grant>> {
        let mut g: Vec<Arc<Grant>> = self.by_hash.values().cloned().collect();
        g.sort_by(|a, b| a.name.cmp(&b.name));
        g
    }

    fn to_toml(&self) -> Result<String, String> {
        let body = toml::to_string(&TokenFile { token: self.entries.clone() }).map_err(|e| e.to_string())?;
        Ok(format!(
            "# Named API tokens (`flotilla token create`): each token's SHA-256, never the token.\n\
             # Read again every 10 s and on SIGHUP; a file that does not load is refused whole.\n\n{body}"
        ))
    }
}

fn check_name(name: &str) -> Result<(), &'static str> {
    let ok = (1..=63).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        && !name.starts_with('-');
    if ok { Ok(()) } else { Err("must be 1-63 of [a-z0-9_-], not starting with '-'") }
}

fn sha256(token: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_hex(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// A new token: 32 random bytes, hex, prefixed so a leaked one is recognisable.
fn new_token() -> Result<String, String> {
    let mut bytes = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| "the system's random source failed".to_string())?;
    Ok(format!("flt_{}", hex(&bytes)))
}

/// The token book a process serves with, and the file it follows and writes.
#[derive(Default)]
pub struct Tokens {
    book: ArcSwap<TokenBook>,
    file: Option<PathBuf>,
    /// One writer of the file at a time (create and revoke read, change, write it).
    writing: Mutex<()>,
    ever_had: std::sync::atomic::AtomicBool,
}

/// Why a token could not be made or revoked.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("{0}")]
    Invalid(String),
    #[error("this process has no tokens file (start it with --tokens-file, or use `flotilla up`)")]
    NoFile,
    #[error("no token named {0:?}")]
    NoSuchToken(String),
    #[error("{0}")]
    Storage(String),
}

impl Tokens {
    /// Follows `file` (when given); its tokens now, or an error naming what is wrong.
    pub fn open(file: Option<PathBuf>) -> Result<Tokens, String> {
        let t = Tokens { file, ..Default::default() };
        t.reload()?;
        Ok(t)
    }

    pub fn book(&self) -> Arc<TokenBook> {
        self.book.load_full()
    }

    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// Reads the file again; a missing file is an empty book. On an error the book in
    /// force stays. Returns whether it changed.
    pub fn reload(&self) -> Result<bool, String> {
        let _one = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        self.reload_locked()
    }

    /// [`Tokens::reload`], with the writer's lock held: a reload never puts back a book
    /// a create or revoke replaced.
    fn reload_locked(&self) -> Result<bool, String> {
        let Some(path) = &self.file else { return Ok(false) };
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let book = TokenBook::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let changed = book.entries != self.book.load().entries;
        if changed {
            self.store(book);
        }
        Ok(changed)
    }

    fn store(&self, book: TokenBook) {
        if !book.is_empty() {
            self.ever_had.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        self.book.store(Arc::new(book));
    }

    /// Whether named tokens ever were in force here: then an emptied, deleted or fully
    /// revoked file leaves the API closed (only the API token, if any), never open.
    pub fn ever_had(&self) -> bool {
        self.ever_had.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Makes a token, writes its hash to the file, and returns the token (shown once).
    pub fn create(&self, name: &str, scopes: &[String], apps: Option<Vec<String>>) -> Result<String, TokenError> {
        let path = self.file.clone().ok_or(TokenError::NoFile)?;
        let _one = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        // From the file as it is now: a hand edit made since the last reload stays.
        self.reload_locked().map_err(TokenError::Storage)?;
        let token = new_token().map_err(TokenError::Storage)?;
        let mut entries = self.book.load().entries.clone();
        entries.push(TokenEntry {
            name: name.to_string(),
            scopes: scopes.to_vec(),
            apps,
            sha256: hex(&sha256(&token)),
        });
        self.write(&path, entries)?;
        Ok(token)
    }

    /// Removes the token named `name`: it is refused from now on.
    pub fn revoke(&self, name: &str) -> Result<(), TokenError> {
        let path = self.file.clone().ok_or(TokenError::NoFile)?;
        let _one = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        self.reload_locked().map_err(TokenError::Storage)?;
        let mut entries = self.book.load().entries.clone();
        let before = entries.len();
        entries.retain(|e| e.name != name);
        if entries.len() == before {
            return Err(TokenError::NoSuchToken(name.to_string()));
        }
        self.write(&path, entries)
    }

    fn write(&self, path: &Path, entries: Vec<TokenEntry>) -> Result<(), TokenError> {
        let book = TokenBook::from_entries(entries).map_err(TokenError::Invalid)?;
        let text = book.to_toml().map_err(TokenError::Storage)?;
        flotilla_obs::fsutil::write_atomic(path, text.as_bytes(), 0o600)
            .map_err(|e| TokenError::Storage(format!("{}: {e}", path.display())))?;
        self.store(book);
        Ok(())
    }
}

/// The tokens a process accepts: the API token and the named ones.
#[derive(Clone, Default)]
pub struct Credentials {
    pub api_token: flotilla_core::SharedToken,
    pub tokens: Arc<Tokens>,
}

impl Credentials {
    /// Whether any token is set up: without one every call is open (a development setup).
    pub fn configured(&self) -> bool {
        self.api_token.get().is_some() || self.tokens.ever_had() || !self.tokens.book().is_empty()
    }

    /// The grant of the request's bearer token, if it carries a valid one. Not counted:
    /// a request without one may still be one the API answers.
    pub fn carried(&self, headers: &HeaderMap) -> Option<Arc<Grant>> {
        let got = bearer(headers)?;
        if let Some(want) = self.api_token.get()
            && flotilla_core::constant_time_eq(got.as_bytes(), want.as_bytes())
        {
            return Some(Arc::new(Grant::admin(API_TOKEN_NAME)));
        }
        self.tokens.book().find(got)
    }

    /// The caller's grant: `Ok(None)` when no token is set up (every call is open), or
    /// why not, for a missing or unknown token.
    pub fn grant(&self, headers: &HeaderMap) -> Result<Option<Arc<Grant>>, &'static str> {
        if !self.configured() {
            return Ok(None);
        }
        if let Some(g) = self.carried(headers) {
            return Ok(Some(g));
        }
        Err(match bearer(headers) {
            None => "this call needs Authorization: Bearer <API token> (see $FLOTILLA_DATA/api-token)",
            Some(_) => "the bearer token is wrong",
        })
    }

    /// Whether the reader is shown what only deployers of `app` see (secret-looking env
    /// values in its specs): no token is set up, or its token may deploy that app.
    pub fn shows_secrets(&self, headers: &HeaderMap, app: &str) -> bool {
        !self.configured() || self.carried(headers).is_some_and(|g| g.refuses(Scope::Deploy, Some(app)).is_none())
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(flotilla_core::bearer_token)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, scopes: &[&str], apps: Option<&[&str]>, token: &str) -> String {
        let apps = apps.map(|a| format!("apps = {a:?}\n")).unwrap_or_default();
        format!("[[token]]\nname = {name:?}\nscopes = {scopes:?}\n{apps}sha256 = {:?}\n", hex(&sha256(token)))
    }

    #[test]
    fn a_token_is_found_by_its_hash_and_its_scopes_and_apps_decide() {
        let text = entry("ci", &["deploy"], Some(&["echo"]), "t-ci") + &entry("ops", &["operate"], None, "t-ops");
        let book = TokenBook::parse(&text).unwrap();
        let ci = book.find("t-ci").unwrap();
        assert_eq!(ci.refuses(Scope::Deploy, Some("echo")), None);
        assert_eq!(ci.refuses(Scope::Read, None), None, "every token reads");
        assert_eq!(
            ci.refuses(Scope::Operate, Some("echo")).unwrap(),
            "token \"ci\" lacks the operate scope (it has deploy)"
        );
        assert!(ci.refuses(Scope::Deploy, Some("other")).unwrap().contains("limited to apps echo"));
        assert!(ci.refuses(Scope::Deploy, None).unwrap().contains("belongs to none"));
        let ops = book.find("t-ops").unwrap();
        assert_eq!(ops.refuses(Scope::Operate, None), None);
        assert!(book.find("t-nope").is_none());
        assert_eq!(Grant::admin("a").refuses(Scope::Admin, None), None);
        assert_eq!(Grant::admin("a").refuses(Scope::Deploy, Some("x")), None);
    }

    #[test]
    fn secrets_are_shown_to_tokens_that_may_deploy_that_app() {
        let dir = std::env::temp_dir().join(format!("flotilla-tokens-secrets-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokens.toml");
        std::fs::write(
            &path,
            entry("ci", &["deploy"], Some(&["echo"]), "t-ci") + &entry("ops", &["operate"], None, "t-ops"),
        )
        .unwrap();
        let creds = Credentials { api_token: Default::default(), tokens: Arc::new(Tokens::open(Some(path)).unwrap()) };
        let with = |t: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, format!("Bearer {t}").parse().unwrap());
            h
        };
        assert!(creds.shows_secrets(&with("t-ci"), "echo"));
        assert!(!creds.shows_secrets(&with("t-ci"), "billing"), "limited to echo");
        assert!(!creds.shows_secrets(&with("t-ops"), "echo"), "operate is not deploy");
        assert!(!creds.shows_secrets(&HeaderMap::new(), "echo"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_bad_file_is_refused_whole_with_every_problem() {
        let text = entry("ci", &["deploy", "root"], None, "a")
            + &entry("ci", &["read"], Some(&[]), "b")
            + "[[token]]\nname = \"Bad Name\"\nscopes = []\nsha256 = \"xyz\"\n";
        let e = TokenBook::parse(&text).unwrap_err();
        for want in
            ["unknown scope \"root\"", "the name is taken", "apps must list", "name must be", "no scope", "64 hex"]
        {
            assert!(e.contains(want), "{want}: {e}");
        }
        assert!(TokenBook::parse("[[token]]\nname = \"x\"\nscope = [\"read\"]\n").is_err(), "unknown key");
        assert!(TokenBook::parse("").unwrap().is_empty());
    }

    #[test]
    fn created_tokens_are_stored_hashed_revoked_by_name_and_a_bad_edit_keeps_the_book() {
        let dir = std::env::temp_dir().join(format!("flotilla-tokens-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokens.toml");
        let t = Tokens::open(Some(path.clone())).unwrap();
        let token = t.create("ci", &["deploy".into()], Some(vec!["echo".into()])).unwrap();
        assert!(token.starts_with("flt_") && token.len() == 68, "{token}");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&token) && text.contains(&hex(&sha256(&token))), "{text}");
        assert_eq!(t.book().find(&token).unwrap().name, "ci");
        assert!(matches!(t.create("ci", &["read".into()], None), Err(TokenError::Invalid(_))));
        assert!(matches!(t.create("x", &["root".into()], None), Err(TokenError::Invalid(_))));
        // Another process (or an operator) reads the same file.
        let other = Tokens::open(Some(path.clone())).unwrap();
        assert_eq!(other.book().find(&token).unwrap().name, "ci");
        // A bad edit is refused; the book in force stays.
        std::fs::write(&path, "[[token]]\nname = \"ci\"\nscopes = [\"superuser\"]\nsha256 = \"00\"\n").unwrap();
        assert!(other.reload().unwrap_err().contains("superuser"));
        assert!(other.book().find(&token).is_some());
        // A hand edit made since the last reload is kept by the next create.
        std::fs::write(&path, &text).unwrap();
        let extra = t.create("ops", &["operate".into()], None).unwrap();
        let now = std::fs::read_to_string(&path).unwrap();
        assert!(now.contains("name = \"ci\"") && now.contains("name = \"ops\""), "{now}");
        t.revoke("ops").unwrap();
        assert!(t.book().find(&extra).is_none());
        t.revoke("ci").unwrap();
        assert!(t.book().find(&token).is_none());
        assert!(t.book().is_empty() && t.ever_had(), "the last token revoked: closed, not open");
        assert!(matches!(t.revoke("ci"), Err(TokenError::NoSuchToken(_))));
        let creds = Credentials { api_token: Default::default(), tokens: Arc::new(t) };
        assert!(creds.configured());
        assert!(other.reload().unwrap());
        assert!(other.book().find(&token).is_none());
        assert!(matches!(Tokens::default().create("x", &[], None), Err(TokenError::NoFile)));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
