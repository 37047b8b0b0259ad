//! App autoscaling policies, the pure core: configuration, signals, evaluation, decisions.
//! No I/O and no clock: the scheduler loop samples signals every `interval`, calls [`evaluate`]
//! with the current time, and applies the returned [`Decision`].
//!
//! Two algorithms, with the knobs, names and bounds of their originals:
//! * `basic` — Dataproc autoscaling policies' `basicAlgorithm` ([`basic`]);
//! * `utilization` — MR3's auto-scaling by utilisation thresholds ([`utilization`]).

pub mod basic;
pub mod config;
pub mod decision;
pub mod signals;
pub mod sim;
mod span;
pub mod utilization;
mod window;

#[cfg(test)]
mod tests;

pub use basic::BasicState;
pub use config::{
    Algorithm, AutoscalingConfig, BasicConfig, BasicPolicy, ConfigError, EstimateFrom, Group, GroupConfig, Metric,
    Policy, PolicyChoice, Problem, Problems, Scheme, Span, UtilizationConfig, UtilizationPolicy,
};
pub use decision::{Action, Decision, Inputs, Phase, Reason, Units};
pub use signals::{GroupUnits, Load, MemberUsage, Res, Signals};
pub use sim::{Model, PolicyFileError, Row, Sample, SimReport, Trace, TraceError, policy_file_from_toml, simulate};
pub use utilization::UtilizationState;

/// A policy's memory between evaluations: bounded sample history, last action, MR3 state.
/// Fixed-size and inline (about 2 KiB for `basic`): one per app, no allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum State {
    Basic(BasicState),
    Utilization(UtilizationState),
}

impl State {
    pub fn new(policy: &Policy) -> Self {
        match &policy.algorithm {
            Algorithm::Basic(p) => State::Basic(BasicState::new(p)),
            Algorithm::Utilization(p) => State::Utilization(UtilizationState::new(p)),
        }
    }
}

/// Evaluates `policy` once. Pure apart from updating `state`; a state of the other algorithm
/// (the app's policy changed) is replaced by a fresh one.
pub fn evaluate(policy: &Policy, state: &mut State, signals: &Signals, now_ms: u64) -> Decision {
    if !matches!(
        (&policy.algorithm, &*state),
        (Algorithm::Basic(_), State::Basic(_)) | (Algorithm::Utilization(_), State::Utilization(_))
    ) {
        *state = State::new(policy);
    }
    let mut d = match (&policy.algorithm, state) {
        (Algorithm::Basic(p), State::Basic(st)) => basic::evaluate(p, st, signals, now_ms),
        (Algorithm::Utilization(p), State::Utilization(st)) => utilization::evaluate(p, st, signals, now_ms),
        _ => unreachable!("state matched to the policy above"),
    };
    d.policy_name = policy.name.clone();
    d
}
