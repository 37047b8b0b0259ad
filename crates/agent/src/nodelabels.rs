//! The node's own Kubernetes labels (`--node-labels-from-kubernetes`): the downward API
//! gives a pod its own labels but not its node's, so an agent in a DaemonSet asks the
//! API server for its Node once at start, with the pod's ServiceAccount token (the
//! manifest grants `get` on nodes and nothing else).
//!
//! Only labels that describe the failure domain and the machine are taken, renamed to
//! Flotilla's keys; `flotilla.io/KEY` node labels are taken as `KEY`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};

/// The in-cluster ServiceAccount files the kubelet mounts.
pub const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Well-known Kubernetes node labels and the Flotilla label each becomes.
pub const WELL_KNOWN: [(&str, &str); 4] = [
    ("topology.kubernetes.io/zone", "zone"),
    ("topology.kubernetes.io/region", "region"),
    ("node.kubernetes.io/instance-type", "instance_type"),
    ("kubernetes.io/arch", "arch"),
];

/// The Flotilla labels among a Node's labels.
pub fn select(node_labels: &BTreeMap<String, String>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (k, v) in node_labels {
        if let Some((_, ours)) = WELL_KNOWN.iter().find(|(theirs, _)| theirs == k) {
            out.push((ours.to_string(), v.clone()));
        } else if let Some(key) = k.strip_prefix(crate::config::LABEL_PREFIX).filter(|k| !k.is_empty()) {
            out.push((key.to_string(), v.clone()));
        }
    }
    out
}

/// The API server's URL from the variables the kubelet sets in every pod.
pub fn api_server(env: &[(String, String)]) -> Option<String> {
    let get = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let (host, port) = (get("KUBERNETES_SERVICE_HOST")?, get("KUBERNETES_SERVICE_PORT").unwrap_or("443".into()));
    Some(if host.contains(':') { format!("https://[{host}]:{port}") } else { format!("https://{host}:{port}") })
}

/// GET `{base}/api/v1/nodes/{node}` with `token` (and `ca_pem` as the only trusted CA):
/// the node's labels.
pub async fn fetch(
    base: &str,
    node: &str,
    token: &str,
    ca_pem: Option<&[u8]>,
) -> anyhow::Result<BTreeMap<String, String>> {
    let mut b = reqwest::Client::builder().timeout(Duration::from_secs(10));
    if let Some(pem) = ca_pem {
        for c in reqwest::Certificate::from_pem_bundle(pem).context("parsing the API server's CA")? {
            b = b.add_root_certificate(c);
        }
    }
    let url = format!("{}/api/v1/nodes/{node}", base.trim_end_matches('/'));
    let resp = b.build()?.get(&url).bearer_auth(token).send().await.with_context(|| format!("GET {url}"))?;
    let status = resp.status();
    if !status.is_success() {
        let body = resp.text().await.unwrap_or_default();
        bail!("GET {url}: {status} (the agent's ServiceAccount needs `get` on nodes): {}", body.trim());
    }
    let node: serde_json::Value = resp.json().await.with_context(|| format!("GET {url}: not JSON"))?;
    let labels = node["metadata"]["labels"].as_object().cloned().unwrap_or_default();
    Ok(labels.into_iter().filter_map(|(k, v)| v.as_str().map(|v| (k, v.to_string()))).collect())
}

/// The Flotilla labels of Node `node`, asked with the pod's in-cluster ServiceAccount.
pub async fn from_cluster(node: &str, env: &[(String, String)]) -> anyhow::Result<Vec<(String, String)>> {
    let base = api_server(env)
        .ok_or_else(|| anyhow::anyhow!("KUBERNETES_SERVICE_HOST is not set: not in a Kubernetes pod"))?;
    let dir = Path::new(SERVICE_ACCOUNT);
    let read = |f: &str| std::fs::read(dir.join(f)).with_context(|| format!("reading {}", dir.join(f).display()));
    let token = String::from_utf8_lossy(&read("token")?).trim().to_string();
    let ca = read("ca.crt")?;
    Ok(select(&fetch(&base, node, &token, Some(&ca)).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_known_and_prefixed_labels_are_taken() {
        let node: BTreeMap<String, String> = [
            ("topology.kubernetes.io/zone", "eu-west-1a"),
            ("node.kubernetes.io/instance-type", "m6i.large"),
            ("flotilla.io/priority", "low"),
            ("flotilla.io/", "ignored"),
            ("kubernetes.io/hostname", "ignored"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let mut got = select(&node);
        got.sort();
        let want: Vec<(String, String)> = [("instance_type", "m6i.large"), ("priority", "low"), ("zone", "eu-west-1a")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(got, want);
        let env = |h: &str| vec![("KUBERNETES_SERVICE_HOST".to_string(), h.to_string())];
        assert_eq!(api_server(&env("10.0.0.1")).as_deref(), Some("https://10.0.0.1:443"));
        assert_eq!(api_server(&env("fd00::1")).as_deref(), Some("https://[fd00::1]:443"));
        assert_eq!(api_server(&[]), None);
    }

    /// A stand-in API server (plain HTTP) that answers one request with `answer`; the
    /// request it got.
    async fn api_once(answer: &'static str) -> (String, tokio::task::JoinHandle<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding");
        let base = format!("http://{}", l.local_addr().expect("address"));
        let task = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.expect("accepting");
            let mut buf = vec![0u8; 4096];
            let n = s.read(&mut buf).await.expect("reading");
            s.write_all(answer.as_bytes()).await.expect("writing");
            String::from_utf8_lossy(&buf[..n]).into_owned()
        });
        (base, task)
    }

    #[tokio::test]
    async fn the_node_is_asked_with_the_token_and_a_refusal_says_what_is_missing() {
        let body = r#"{"metadata":{"name":"n1","labels":{"topology.kubernetes.io/zone":"z1"}}}"#;
        let answer = Box::leak(
            format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
                .into_boxed_str(),
        );
        let (base, request) = api_once(answer).await;
        let labels = fetch(&base, "n1", "sa-token", None).await.expect("the node's labels");
        assert_eq!(labels.get("topology.kubernetes.io/zone").map(String::as_str), Some("z1"));
        let request = request.await.expect("the request");
        assert!(request.starts_with("GET /api/v1/nodes/n1 "), "{request}");
        assert!(request.to_ascii_lowercase().contains("authorization: bearer sa-token"), "{request}");

        let (base, _) =
            api_once("HTTP/1.1 403 Forbidden\r\nContent-Length: 9\r\nConnection: close\r\n\r\nforbidden").await;
        let e = format!("{:#}", fetch(&base, "n1", "t", None).await.expect_err("refused"));
        assert!(e.contains("403") && e.contains("needs `get` on nodes"), "{e}");
    }
}
