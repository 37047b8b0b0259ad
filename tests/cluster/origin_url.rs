//! The artifact origin kept at an HTTP URL (a real nginx taking WebDAV PUTs): a push
//! lands there with its manifest, and members fetch it through a control plane that no
//! longer holds its own copy, as a replica that did not take the push would (an apply
//! there still learns the artifact's size from the URL); with the URL gone, a push fails
//! saying so.

use std::time::Duration;

use flotilla_artifact::Digest;
use flotilla_artifact::manifest::Manifest;
use flotilla_testkit::{Nginx, TempDir, Up, exchange, metric, metrics_page, run_ok, wait_for};

#[test]
fn a_push_lands_at_the_origin_url_and_members_fetch_it_from_there() {
    let nginx = Nginx::start("origin-url");
    let dir = TempDir::new("origin-url-files");
    let model: Vec<u8> = (0..3u64 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8).collect();
    let d = Digest::of(&model);
    std::fs::write(dir.path().join("model.bin"), &model).unwrap();
    let spec = |d: &Digest| {
        format!(
            "name = \"far\"\n[unit]\nworkers = 0\n[unit.head]\ncommand = \"/bin/sh\"\n\
             args = [\"-c\", \"test -r model.bin && exec sleep 600\"]\ncpu = \"100m\"\nmemory = \"32Mi\"\n\
             [[unit.head.artifacts]]\nsource = \"flotilla://{d}\"\nsha256 = \"{}\"\ndest = \"model.bin\"\n\
             [constraints]\nallow_low_priority = true\n[units]\nmin = 0\nmax = 2\ninitial = 0\n",
            d.hex()
        )
    };
    let spec_file = dir.path().join("far.toml");
    std::fs::write(&spec_file, spec(&d)).unwrap();
    // Caches of 4 MiB: the 3 MiB model fits, a 5 MiB one would not.
    let up = Up::start_with_env(
        "origin-url",
        &[
            "--agents",
            "2",
            "--shards",
            "1",
            "--app",
            spec_file.to_str().unwrap(),
            "--artifact-origin-url",
            &nginx.url(),
        ],
        &[("FLOTILLA_ARTIFACT_CACHE", "4Mi")],
    );

    // The push is at the URL: the bytes, and the manifest that lets agents check pieces.
    let pushed = run_ok(up.cli().args(["artifact", "push"]).arg(dir.path().join("model.bin")));
    assert_eq!(pushed.trim(), format!("flotilla://{d}"));
    assert_eq!(std::fs::read(nginx.file(&d.hex())).unwrap(), model);
    let manifest = Manifest::decode(&std::fs::read(nginx.file(&format!("{}.manifest", d.hex()))).unwrap()).unwrap();
    assert_eq!((manifest.size, manifest.count()), (model.len() as u64, 3));

    // This control plane's own copy goes: members fetch what only the URL holds.
    let local = up.data.join("artifacts").join(d.hex());
    run_ok(std::process::Command::new("chmod").arg("-R").arg("u+w").arg(&local));
    std::fs::remove_dir_all(&local).unwrap();
    run_ok(up.cli().args(["scale", "far", "--units", "2"]));
    wait_for("both units running with the model", Duration::from_secs(90), || {
        let units = up.units("far");
        (units.len() == 2 && units.iter().all(|u| u["state"] == "running")).then_some(())
    });
    let log = nginx.access_log();
    assert!(log.contains(&format!("GET /files/{}.manifest", d.hex())), "{log}");
    assert!(log.lines().any(|l| l.contains(&format!("GET /files/{} ", d.hex()))), "{log}");
    let page = metrics_page(up.addr.trim_start_matches("http://"));
    let reads = metric(&page, "flotilla_origin_remote_requests_total", "op=\"read\",result=\"ok\"");
    assert!(reads.unwrap_or(0.0) >= 1.0, "{page}");
    assert!(!local.exists(), "a read through the URL keeps no copy here");

    // Reads through the URL are checked like local ones: one range, inside the artifact,
    // answered as asked; an artifact the URL lacks is 404.
    let get = |path: &str, range: &str| {
        let range = if range.is_empty() { String::new() } else { format!("Range: {range}\r\n") };
        exchange(&up.addr, &format!("GET {path} HTTP/1.1\r\nHost: x\r\n{range}Connection: close\r\n\r\n"))
    };
    let path = format!("/v1/artifacts/{d}");
    let ranged = get(&path, "bytes=1-3").to_ascii_lowercase();
    assert!(ranged.starts_with("http/1.1 206") && ranged.contains("content-range: bytes 1-3/3145728"), "{ranged}");
    assert!(get(&path, "bytes=0-,0-").starts_with("HTTP/1.1 400"), "several ranges are refused");
    assert!(get(&path, "bytes=9999999-").starts_with("HTTP/1.1 400"), "a range past the end is refused");
    let other = Digest::of(b"never pushed");
    assert!(get(&format!("/v1/artifacts/{other}"), "").starts_with("HTTP/1.1 404"));

    // An apply where the push is not kept still learns its size, from the URL's manifest,
    // and refuses an artifact no cache could hold.
    let big = vec![7u8; 5 << 20];
    let big_digest = Digest::of(&big);
    std::fs::write(dir.path().join("big.bin"), &big).unwrap();
    run_ok(up.cli().args(["artifact", "push"]).arg(dir.path().join("big.bin")));
    let big_local = up.data.join("artifacts").join(big_digest.hex());
    run_ok(std::process::Command::new("chmod").arg("-R").arg("u+w").arg(&big_local));
    std::fs::remove_dir_all(&big_local).unwrap();
    let big_spec = dir.path().join("far-big.toml");
    std::fs::write(&big_spec, spec(&big_digest)).unwrap();
    let refused = up.cli().arg("apply").arg(&big_spec).output().unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("need 5 MiB of artifact cache"), "{stderr}");

    // Without the URL, a push is refused, and says where it could not go.
    drop(nginx);
    std::fs::write(dir.path().join("other.bin"), b"another artifact").unwrap();
    let out = up.cli().args(["artifact", "push"]).arg(dir.path().join("other.bin")).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("did not take it (it is kept here; push it again)"), "{stderr}");
    assert!(!stderr.contains("127.0.0.1"), "the origin URL stays out of answers: {stderr}");
}
