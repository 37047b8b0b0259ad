//! A disk that fills during a fetch: the fetch fails saying so and is retried rather than
//! failed for good, what it wrote is removed so the rest of the node gets the space back,
//! a file beside the cache is untouched, and once there is room the retry verifies the
//! whole. A small tmpfs plays the disk, so this needs root (as CI runs).

#![allow(clippy::unwrap_used, reason = "a test: a failed step fails it, with the panic's message")]

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use flotilla_artifact::auth::PeerKeys;
use flotilla_artifact::fetch::{Config, Progress, Want};
use flotilla_artifact::{Artifacts, Digest, Source};

/// A tmpfs of `mib` MiB at a fresh directory, unmounted and removed when dropped.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(mib: u32) -> SmallDisk {
        let dir = std::env::temp_dir().join(format!("flotilla-full-disk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let disk = SmallDisk(dir);
        disk.tmpfs(&format!("size={mib}m"));
        disk
    }

    fn tmpfs(&self, opts: &str) {
        let remount = if opts.starts_with("remount") { vec![] } else { vec!["-t", "tmpfs", "tmpfs"] };
        let out = Command::new("mount").args(remount).args(["-o", opts]).arg(&self.0).output().unwrap();
        assert!(
            out.status.success(),
            "mount -o {opts} (this test needs root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Serves `body` to every GET on loopback.
fn http_origin(body: Vec<u8>) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && conn.read(&mut b).is_ok_and(|n| n == 1) {
                head.push(b[0]);
            }
            let _ = write!(conn, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
            let _ = conn.write_all(&body);
        }
    });
    format!("http://{addr}/model.bin")
}

fn wait(what: &str, arts: &std::sync::Arc<Artifacts>, want: &Want, done: impl Fn(&Progress) -> bool) -> Progress {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let p = arts.want(want);
        if done(&p) {
            return p;
        }
        assert!(Instant::now() < deadline, "no {what} within 60 s: {p:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_that_fills_the_disk_gives_the_space_back_and_succeeds_once_there_is_room() {
    let disk = SmallDisk::mount(3);
    let neighbour = disk.path().join("member.log");
    std::fs::write(&neighbour, vec![b'x'; 256 << 10]).unwrap();
    let model: Vec<u8> = (0..6u64 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let want = Want { digest: Digest::of(&model), source: Source::Http(http_origin(model.clone())), unpack: None };
    let arts = Artifacts::start(Config {
        node: "n1".into(),
        dir: disk.path().join("artifacts"),
        cap: 1 << 30,
        origin: None,
        keys: PeerKeys::from_tokens(&["join-token".to_string()]),
        bind: "127.0.0.1:0".parse().unwrap(),
        listen: true,
        advertise: "127.0.0.1".into(),
        upload_rate: None,
        download_rate: None,
        max_uploads: 4,
        corrupt_uploads: false,
    })
    .unwrap();

    let arts2 = arts.clone();
    let want2 = want.clone();
    let failed =
        tokio::task::spawn_blocking(move || wait("failure", &arts2, &want2, |p| matches!(p, Progress::Failed { .. })))
            .await
            .unwrap();
    let Progress::Failed { why, lasting } = failed else { unreachable!() };
    assert!(!lasting, "a full disk is retried: {why}");
    assert!(why.contains("No space left") && why.contains("the disk is full"), "{why}");
    let held: u64 = walk(&disk.path().join("artifacts"));
    assert!(held < 64 << 10, "{held} bytes of the failed fetch are still on the disk");
    assert_eq!(std::fs::read(&neighbour).unwrap(), vec![b'x'; 256 << 10], "a file beside the cache changed");

    // Room again: the retry (after its back-off) fetches and verifies the whole.
    disk.tmpfs("remount,size=32m");
    let ready =
        tokio::task::spawn_blocking(move || wait("fetch", &arts, &want, |p| matches!(p, Progress::Ready { .. })))
            .await
            .unwrap();
    let Progress::Ready { blob, .. } = ready else { unreachable!() };
    assert_eq!(std::fs::read(blob).unwrap(), model);
}

/// Bytes in the files under `dir`.
fn walk(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => walk(&e.path()),
            _ => e.metadata().map(|m| m.len()).unwrap_or(0),
        })
        .sum()
}
