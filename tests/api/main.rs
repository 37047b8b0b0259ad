//! The API against its OpenAPI 3.1 contract: `conformance.py` validates `GET
//! /openapi.json` with openapi-spec-validator and checks every documented operation's
//! real answers, from a real `flotilla up`, against the document. `.ci/run` installs the
//! validator (with jsonschema) from PyPI.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a test: a failed step fails it, with the panic's message")]

use std::process::Command;

#[test]
fn every_documented_operation_answers_as_the_contract_says() {
    let root = env!("CARGO_MANIFEST_DIR");
    let run = Command::new("python3")
        .arg(format!("{root}/tests/api/conformance.py"))
        .arg("--flotilla")
        .arg(flotilla_testkit::bin("flotilla"))
        .output()
        .expect("running python3");
    let (stdout, stderr) = (String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(
        run.status.success(),
        "the contract test failed ({}):\n{stdout}\n{stderr}\n(it needs `pip install openapi-spec-validator`: .ci/run installs it)",
        run.status
    );
    let summary: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or("{}")).unwrap();
    assert!(summary["operations"].as_u64().unwrap() >= 40, "{summary}");
}
