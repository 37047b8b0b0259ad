//! The shard's wire boundary: every conversion between the `v1` messages its services
//! speak and the shard's own types (claims, claim keys, workloads, assignments), with
//! the validation that guards it, so that nothing behind an adapter sees unchecked input.
//! Pure: no I/O, no metrics. Input that does not decode is an [`InvalidRequest`] naming
//! the field; the adapters answer it through the one error mapping. (Capacity, labels
//! and health decode in `flotilla_proto::convert`, shared with every other service.)

use flotilla_core::{ErrorKind, NodeId, Resources, ServiceError};
use flotilla_proto::v1;

use crate::ledger::{Claim, ClaimKey, ClaimReject, ConfirmStatus, Outcome};

/// Most claims (or keys) in one request.
pub const MAX_CLAIMS: usize = 4096;
/// Longest app, unit, member or transaction name, in bytes.
pub const MAX_NAME: usize = 128;
/// Longest reservation.
pub const MAX_TTL_MS: u32 = 600_000;
/// Most members one workload report may carry.
pub const MAX_REPORTED_WORKLOADS: usize = 1024;
/// Largest workload of a claim: command, arguments and environment together, in bytes.
const MAX_WORKLOAD_BYTES: usize = 64 * 1024;
/// A member's artifacts, at most (the spec's limit too).
const MAX_ARTIFACTS: usize = 16;
/// Most arguments, and most environment variables, of a workload.
const MAX_WORKLOAD_ITEMS: usize = 256;
/// Longest address a workload report may give for a member, in bytes.
const MAX_REPORTED_ADDRESS: usize = 256;
/// A reported status message is cut to this many bytes.
const MAX_REPORTED_MESSAGE: usize = 1024;

/// A request, or a part of one, that does not decode: which field, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {why}")]
pub struct InvalidRequest {
    pub field: String,
    pub why: String,
}

impl InvalidRequest {
    pub fn new(field: impl Into<String>, why: impl std::fmt::Display) -> Self {
        InvalidRequest { field: field.into(), why: why.to_string() }
    }
}

impl ServiceError for InvalidRequest {
    fn kind(&self) -> ErrorKind {
        ErrorKind::InvalidInput
    }

    fn code(&self) -> &'static str {
        "invalid"
    }
}

pub(crate) fn name(field: &str, s: &str) -> Result<(), InvalidRequest> {
    if s.is_empty() || s.len() > MAX_NAME || s.chars().any(char::is_control) {
        return Err(InvalidRequest::new(field, format!("must be 1..={MAX_NAME} bytes without control characters")));
    }
    Ok(())
}

/// A transaction id (of a commit, reservation, confirm or release).
pub fn txn_from_wire(txn: &str) -> Result<(), InvalidRequest> {
    name("txn_id", txn)
}

/// A node id named in `field`.
/// `field` is formatted only on error (a commit names 512 claims' fields).
pub fn node_id_from_wire(field: impl std::fmt::Display, id: &str) -> Result<NodeId, InvalidRequest> {
    NodeId::new(id).map_err(|e| InvalidRequest::new(field.to_string(), e))
}

/// A reservation's time to live, in milliseconds.
pub fn ttl_from_wire(ttl_ms: u32) -> Result<u64, InvalidRequest> {
    if ttl_ms == 0 || ttl_ms > MAX_TTL_MS {
        return Err(InvalidRequest::new("ttl_ms", format!("must be within 1..={MAX_TTL_MS}")));
    }
    Ok(u64::from(ttl_ms))
}

fn key_from_wire(k: Option<v1::ClaimKey>) -> Result<ClaimKey, InvalidRequest> {
    let k = k.ok_or_else(|| InvalidRequest::new("key", "missing"))?;
    name("key.app", &k.app)?;
    name("key.unit", &k.unit)?;
    name("key.member", &k.member)?;
    Ok(ClaimKey { app: k.app, unit: k.unit, member: k.member, generation: k.generation })
}

fn key_to_wire(k: &ClaimKey) -> v1::ClaimKey {
    v1::ClaimKey { app: k.app.clone(), unit: k.unit.clone(), member: k.member.clone(), generation: k.generation }
}

/// The keys of a release.
pub fn keys_from_wire(keys: Vec<v1::ClaimKey>) -> Result<Vec<ClaimKey>, InvalidRequest> {
    if keys.len() > MAX_CLAIMS {
        return Err(InvalidRequest::new("keys", format!("at most {MAX_CLAIMS}")));
    }
    keys.into_iter().map(|k| key_from_wire(Some(k))).collect()
}

fn workload_from_wire(
    field: impl std::fmt::Display,
    workload: Option<v1::Workload>,
) -> Result<v1::Workload, InvalidRequest> {
    let workload = workload.unwrap_or_default();
    let size = workload.command.len()
        + workload.args.iter().map(String::len).sum::<usize>()
        + workload.env.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
    if size > MAX_WORKLOAD_BYTES || workload.args.len() > MAX_WORKLOAD_ITEMS || workload.env.len() > MAX_WORKLOAD_ITEMS
    {
        return Err(InvalidRequest::new(field.to_string(), "larger than 64 KiB, 256 args or 256 variables"));
    }
    let ranges: std::collections::BTreeMap<String, u32> =
        workload.port_ranges.iter().map(|(k, v)| (k.clone(), *v)).collect();
    if let Some(problem) = flotilla_core::ports::port_problems(&workload.ports, &ranges).into_iter().next() {
        return Err(InvalidRequest::new(format!("{field}.ports"), problem));
    }
    if !workload.main_port.is_empty() && !workload.ports.contains(&workload.main_port) {
        return Err(InvalidRequest::new(format!("{field}.main_port"), "is not one of its ports"));
    }
    if workload.after.len() > MAX_NAME {
        return Err(InvalidRequest::new(format!("{field}.after"), "too long"));
    }
    if workload.artifacts.len() > MAX_ARTIFACTS || !workload.artifacts.iter().all(flotilla_proto::artifact_fits) {
        return Err(InvalidRequest::new(format!("{field}.artifacts"), "at most 16, each under 4 KiB"));
    }
    Ok(workload)
}

/// Validates and converts a request's claims; every claim must be sane before any is judged.
pub fn claims_from_wire(txn: &str, claims: Vec<v1::Claim>) -> Result<Vec<Claim>, InvalidRequest> {
    txn_from_wire(txn)?;
    if claims.is_empty() || claims.len() > MAX_CLAIMS {
        return Err(InvalidRequest::new("claims", format!("{} claims (1..={MAX_CLAIMS})", claims.len())));
    }
    let claims: Vec<Claim> = claims
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let node = node_id_from_wire(format_args!("claims[{i}].node_id"), &c.node_id)?;
            let resources: Resources = c.resources.unwrap_or_default().into();
            resources.validate_node_capacity().map_err(|e| InvalidRequest::new(format!("claims[{i}].resources"), e))?;
            if c.group.len() > MAX_NAME {
                return Err(InvalidRequest::new(format!("claims[{i}].group"), "too long"));
            }
            let workload = workload_from_wire(format_args!("claims[{i}].workload"), c.workload)?;
            Ok(Claim {
                key: key_from_wire(c.key).map_err(|e| InvalidRequest::new(format!("claims[{i}]"), e))?,
                node,
                incarnation: c.incarnation,
                resources,
                allow_low_priority: c.allow_low_priority,
                group: c.group,
                workload,
            })
        })
        .collect::<Result<_, _>>()?;
    // A key twice in one request would be judged as a replay of itself.
    let mut seen = std::collections::HashMap::with_capacity(claims.len());
    for (i, c) in claims.iter().enumerate() {
        if let Some(first) = seen.insert(&c.key, i) {
            return Err(InvalidRequest::new(format!("claims[{i}].key"), format!("repeats claims[{first}].key")));
        }
    }
    Ok(claims)
}

/// What a registering agent says it runs, as claims on its own node (validated like a
/// commit's), for the ledger to adopt.
pub fn running_from_wire(
    node: &NodeId,
    incarnation: u64,
    assignments: Vec<v1::Assignment>,
) -> Result<Vec<Claim>, InvalidRequest> {
    if assignments.is_empty() {
        return Ok(Vec::new());
    }
    let claims = assignments
        .into_iter()
        .map(|a| v1::Claim {
            key: Some(v1::ClaimKey { app: a.app, unit: a.unit, member: a.member, generation: a.generation }),
            node_id: node.to_string(),
            incarnation,
            resources: a.resources,
            allow_low_priority: true,
            group: String::new(),
            workload: a.workload,
        })
        .collect();
    claims_from_wire("register", claims)
}

/// The assignment an agent receives for one claim.
pub fn assignment_to_wire(c: &Claim) -> v1::Assignment {
    v1::Assignment {
        app: c.key.app.clone(),
        unit: c.key.unit.clone(),
        member: c.key.member.clone(),
        generation: c.key.generation,
        resources: Some((&c.resources).into()),
        workload: Some(c.workload.clone()),
    }
}

/// An agent's report of the members it runs: bounded names and addresses, status
/// messages cut to their limit. Refused whole if any entry is not sane.
pub fn workload_report_from_wire(mut list: Vec<v1::WorkloadStatus>) -> Result<Vec<v1::WorkloadStatus>, InvalidRequest> {
    if list.len() > MAX_REPORTED_WORKLOADS {
        return Err(InvalidRequest::new("workloads", format!("{} (at most {MAX_REPORTED_WORKLOADS})", list.len())));
    }
    for (i, w) in list.iter_mut().enumerate() {
        let names_ok = [&w.app, &w.unit, &w.member].iter().all(|s| !s.is_empty() && s.len() <= MAX_NAME);
        if !names_ok || w.address.len() > MAX_REPORTED_ADDRESS {
            return Err(InvalidRequest::new(
                format!("workloads[{i}]"),
                format!("names must be 1..={MAX_NAME} bytes and the address at most {MAX_REPORTED_ADDRESS}"),
            ));
        }
        let ports_ok = w.ports.len() + w.port_ranges.len() <= flotilla_core::ports::MAX_NAMED_PORTS
            && w.ports.keys().chain(w.port_ranges.keys()).all(|n| flotilla_core::ports::is_port_name(n));
        if !ports_ok {
            return Err(InvalidRequest::new(
                format!("workloads[{i}].ports"),
                format!("at most {} named ports, each a port name", flotilla_core::ports::MAX_NAMED_PORTS),
            ));
        }
        if w.message.len() > MAX_REPORTED_MESSAGE {
            let mut end = MAX_REPORTED_MESSAGE;
            while !w.message.is_char_boundary(end) {
                end -= 1;
            }
            w.message.truncate(end);
        }
    }
    Ok(list)
}

fn reason_to_wire(r: ClaimReject) -> v1::RejectReason {
    match r {
        ClaimReject::NoFit => v1::RejectReason::NoFit,
        ClaimReject::NodeNotAlive(_) => v1::RejectReason::NodeNotAlive,
        ClaimReject::IncarnationMismatch => v1::RejectReason::IncarnationMismatch,
        ClaimReject::UnknownNode => v1::RejectReason::UnknownNode,
        ClaimReject::Recovering => v1::RejectReason::ShardRecovering,
        ClaimReject::Priority => v1::RejectReason::Priority,
        ClaimReject::Group => v1::RejectReason::Group,
        ClaimReject::AlreadyPlaced => v1::RejectReason::AlreadyPlaced,
        ClaimReject::Cordoned => v1::RejectReason::Cordoned,
        ClaimReject::Fenced => v1::RejectReason::Fenced,
    }
}

/// Each claim's verdict, in request order.
pub fn results_to_wire(out: &Outcome) -> Vec<v1::ClaimResult> {
    out.iter()
        .map(|(k, r)| v1::ClaimResult {
            key: Some(key_to_wire(k)),
            accepted: r.is_ok(),
            reason: r.err().map(reason_to_wire).unwrap_or(v1::RejectReason::Unspecified) as i32,
            detail: match r {
                Err(ClaimReject::NodeNotAlive(s)) => format!("node is {s}"),
                Err(e) => e.as_str().to_string(),
                Ok(()) => String::new(),
            },
        })
        .collect()
}

pub fn confirm_status_to_wire(s: ConfirmStatus) -> v1::ConfirmStatus {
    match s {
        ConfirmStatus::Confirmed => v1::ConfirmStatus::Confirmed,
        ConfirmStatus::Expired => v1::ConfirmStatus::Expired,
        ConfirmStatus::UnknownReservation => v1::ConfirmStatus::UnknownReservation,
        ConfirmStatus::Fenced => v1::ConfirmStatus::Fenced,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(unit: &str, node: &str) -> v1::Claim {
        v1::Claim {
            key: Some(v1::ClaimKey { app: "a".into(), unit: unit.into(), member: "head".into(), generation: 1 }),
            node_id: node.into(),
            incarnation: 1,
            resources: Some(v1::Resources { cpu_millis: 100, ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn a_request_naming_a_key_twice_is_refused_whole() {
        assert_eq!(claims_from_wire("t", vec![claim("u1", "n1"), claim("u2", "n1")]).map(|c| c.len()).ok(), Some(2));
        let e = claims_from_wire("t", vec![claim("u1", "n1"), claim("u2", "n1"), claim("u1", "n2")]).unwrap_err();
        assert_eq!(e.to_string(), "claims[2].key: repeats claims[0].key");
        assert!(claims_from_wire("t", vec![]).is_err(), "no claims");
    }

    #[test]
    fn an_invalid_request_is_an_invalid_argument_on_grpc() {
        let mut bad = claim("u1", "n1");
        bad.key.as_mut().unwrap().app = String::new();
        let e = claims_from_wire("t", vec![bad]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("claims[0]: key.app: must be 1..={MAX_NAME} bytes without control characters")
        );
        let s = flotilla_proto::status::status(&e);
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        assert_eq!(flotilla_proto::status::RemoteError::from(s).code, "invalid");
    }

    #[test]
    fn an_assignment_comes_back_as_the_claim_it_was() {
        let claims = claims_from_wire("t", vec![claim("u1", "n1")]).unwrap();
        let node = NodeId::new("n1").unwrap();
        let back = running_from_wire(&node, 1, claims.iter().map(assignment_to_wire).collect()).unwrap();
        assert_eq!((back[0].key.clone(), &back[0].resources), (claims[0].key.clone(), &claims[0].resources));
        assert!(running_from_wire(&node, 1, vec![]).unwrap().is_empty(), "nothing running is not an error");
    }

    #[test]
    fn a_workload_report_is_bounded_and_its_messages_cut() {
        let w = |member: &str, message: String| v1::WorkloadStatus {
            app: "a".into(),
            unit: "u".into(),
            member: member.into(),
            message,
            ..Default::default()
        };
        let kept = workload_report_from_wire(vec![w("m", "é".repeat(MAX_REPORTED_MESSAGE))]).unwrap();
        assert!(kept[0].message.len() <= MAX_REPORTED_MESSAGE);
        assert_eq!(workload_report_from_wire(vec![w("", String::new())]).unwrap_err().field, "workloads[0]");
        let many = vec![w("m", String::new()); MAX_REPORTED_WORKLOADS + 1];
        assert_eq!(workload_report_from_wire(many).unwrap_err().field, "workloads");
        let mut ports = w("m", String::new());
        ports.ports = (0..33).map(|i| (format!("p{i}"), 20_000 + i)).collect();
        assert_eq!(workload_report_from_wire(vec![ports.clone()]).unwrap_err().field, "workloads[0].ports");
        ports.ports = [("Not A Name".to_string(), 1)].into();
        assert!(workload_report_from_wire(vec![ports]).is_err());
    }

    /// A claim's named ports are checked as the spec's are (the shard trusts no scheduler).
    #[test]
    fn a_claim_s_named_ports_are_bounded() {
        let with = |f: &dyn Fn(&mut v1::Workload)| {
            let mut c = claim("u1", "n1");
            f(c.workload.get_or_insert_with(Default::default));
            claims_from_wire("t", vec![c])
        };
        assert!(with(&|w| w.ports = vec!["gcs".into(), "serve".into()]).is_ok());
        assert_eq!(
            with(&|w| w.ports = vec!["gcs".into(), "gcs".into()]).unwrap_err().field,
            "claims[0].workload.ports"
        );
        assert!(with(&|w| w.port_ranges = [("w".to_string(), 5000)].into()).is_err());
        assert_eq!(with(&|w| w.main_port = "serve".into()).unwrap_err().field, "claims[0].workload.main_port");
    }
}
