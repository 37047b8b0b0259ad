//! A real nginx (Debian's `nginx`) as a WebDAV file server for one test: `PUT` stores a
//! file under its root, `GET` serves it with `Range`, like an object store's bucket.
//! Free loopback port, temporary root, killed by process group on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{TempDir, free_port, signal, wait_for};

pub struct Nginx {
    child: Option<Child>,
    dir: TempDir,
    port: u16,
}

impl Nginx {
    /// Starts nginx serving (and taking PUTs into) `ROOT/files/`; returns once it answers.
    pub fn start(name: &str) -> Nginx {
        use std::os::unix::process::CommandExt;
        let dir = TempDir::new(&format!("nginx-{name}"));
        let port = free_port();
        let d = dir.path().to_path_buf();
        std::fs::create_dir_all(d.join("www/files")).unwrap();
        let conf = format!(
            "daemon off;\nmaster_process on;\nworker_processes 1;\nuser root;\npid {d}/nginx.pid;\n\
             error_log {d}/error.log;\nevents {{}}\nhttp {{\n  access_log {d}/access.log;\n\
             client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n\
             uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  client_max_body_size 0;\n\
             server {{\n    listen 127.0.0.1:{port};\n    root {d}/www;\n\
             location /files/ {{ dav_methods PUT DELETE; create_full_put_path on; }}\n  }}\n}}\n",
            d = d.display()
        );
        std::fs::write(d.join("nginx.conf"), conf).unwrap();
        let log = std::fs::File::create(d.join("stderr.log")).unwrap();
        // Debian puts it in /usr/sbin, which a non-root PATH lacks.
        let program =
            ["/usr/sbin/nginx", "nginx"].into_iter().find(|p| std::path::Path::new(p).exists()).unwrap_or("nginx");
        let child = Command::new(program)
            .arg("-p")
            .arg(&d)
            .arg("-c")
            .arg(d.join("nginx.conf"))
            .arg("-e")
            .arg(d.join("error.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("starting nginx (Debian's nginx package): {e}"));
        let n = Nginx { child: Some(child), dir, port };
        wait_for("nginx answering", Duration::from_secs(20), || {
            std::net::TcpStream::connect(("127.0.0.1", n.port)).ok().map(drop)
        });
        n
    }

    /// `http://127.0.0.1:PORT/files/`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/files/", self.port)
    }

    /// Where a file PUT at `url() + name` lands.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join("www/files").join(name)
    }

    /// The requests nginx served, one line each (its access log).
    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            signal(-(c.id() as i32), libc::SIGKILL);
            let _ = c.wait();
        }
    }
}
