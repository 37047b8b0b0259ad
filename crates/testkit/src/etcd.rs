//! A real etcd (`/usr/bin/etcd`, Debian's `etcd-server`) for one test: free loopback
//! ports, a temporary data dir, killed by pid on drop. [`Etcd::kill`] and
//! [`Etcd::restart`] (same data dir, same ports) let a test take etcd away and bring it
//! back with its data.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{TempDir, free_port, signal};

/// The etcd binary: `$FLOTILLA_ETCD` if set, else `etcd` on the PATH.
fn etcd_binary() -> String {
    std::env::var("FLOTILLA_ETCD").unwrap_or_else(|_| "etcd".into())
}

/// One etcd member on loopback.
pub struct Etcd {
    child: Option<Child>,
    dir: TempDir,
    client_port: u16,
    peer_port: u16,
}

impl Etcd {
    /// Starts etcd and waits until it answers `/health`. Panics (with its log) if it
    /// does not within 20 s.
    pub fn start(name: &str) -> Etcd {
        let dir = TempDir::new(&format!("etcd-{name}"));
        let client_port = free_port();
        let mut peer_port = free_port();
        while peer_port == client_port {
            peer_port = free_port();
        }
        let mut e = Etcd { child: None, dir, client_port, peer_port };
        e.spawn();
        e
    }

    fn log(&self) -> PathBuf {
        self.dir.join("etcd.log")
    }

    fn spawn(&mut self) {
        use std::os::unix::process::CommandExt;
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log()).unwrap();
        let child = Command::new(etcd_binary())
            .arg("--name")
            .arg("test")
            .arg("--data-dir")
            .arg(self.dir.join("data"))
            .arg("--listen-client-urls")
            .arg(&client)
            .arg("--advertise-client-urls")
            .arg(&client)
            .arg("--listen-peer-urls")
            .arg(&peer)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer)
            .arg("--initial-cluster")
            .arg(format!("test={peer}"))
            .arg("--initial-cluster-state")
            .arg("new")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {} (install Debian's etcd-server): {e}", etcd_binary()));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.healthy() {
            if let Some(c) = &mut self.child
                && let Ok(Some(status)) = c.try_wait()
            {
                panic!("etcd exited ({status}); its log:\n{}", std::fs::read_to_string(self.log()).unwrap_or_default());
            }
            assert!(
                Instant::now() < deadline,
                "etcd did not answer within 20 s; its log:\n{}",
                std::fs::read_to_string(self.log()).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether etcd answers `GET /health` with `"health":"true"`.
    pub fn healthy(&self) -> bool {
        let addr = format!("127.0.0.1:{}", self.client_port);
        let Ok(mut s) = TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_millis(500)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        if s.write_all(format!("GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes()).is_err()
        {
            return false;
        }
        let mut body = String::new();
        let _ = s.read_to_string(&mut body);
        body.contains("\"health\":\"true\"")
    }

    /// `etcd://127.0.0.1:PORT`, as `--store` takes it.
    pub fn endpoint(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.client_port)
    }

    /// `http://127.0.0.1:PORT`, as `etcdctl --endpoints` takes it.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// The running etcd's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILLs etcd and reaps it; its data dir stays for [`Etcd::restart`].
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            signal(-(c.id() as i32), libc::SIGKILL);
            let _ = c.wait();
        }
    }

    /// Starts etcd again on the same ports with the same data (killing it first if it
    /// runs), and waits until it answers.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Runs `etcdctl ARGS` against this etcd; its stdout. Panics if it fails.
    pub fn ctl(&self, args: &[&str]) -> String {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg("--endpoints")
            .arg(self.url())
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running etcdctl (install Debian's etcd-client): {e}"));
        assert!(out.status.success(), "etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}
