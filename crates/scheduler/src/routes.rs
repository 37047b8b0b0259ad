//! The app's route table and its weights (docs/architecture.md §10). Pure: the view, the unit records and
//! the time go in, the table comes out.
//!
//! ```text
//! weight = performance × health factor
//! ```
//!
//! - **performance**: the spec's `routing.performance`, by the node's `gpu_model` label, else
//!   by its cores, else 1.
//! - **health factor**: the node's published health score (CPU steal or throttling, load
//!   per core, memory pressure; see `flotilla_core::health_score`), smoothed by an EWMA with
//!   a time constant of `TAU_MS`. The factor the table shows moves only when the EWMA
//!   leaves a band of ±`BAND` around it (jitter never changes a weight), and never drops
//!   below `FLOOR` (a sub-healthy node keeps a trickle of traffic, so its recovery shows).
//! - **0 at once** for a member that must get nothing: its node Suspect, Draining, Dead,
//!   restarted, or Unknown (its shard unheard), the member not running, its unit not
//!   Running or Degraded (a Draining unit leaves the routes first).
//!
//! Router feedback (latency, errors) is the other half of the health factor: the router
//! sees it first, so `flotilla-router` applies it on top of this weight, which it takes as
//! its prior.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use flotilla_core::NodeStatus;
use flotilla_proto::v1;
use flotilla_view::ShardSlot;

use crate::lifecycle::UnitState;
use crate::spec::{MemberTemplate, Performance};
use crate::store::{MemberRecord, UnitRecord};

pub const TAU_MS: f64 = 5_000.0;
pub const BAND: f64 = 0.1;
pub const FLOOR: f64 = 0.1;

#[derive(Debug, Clone, Copy)]
struct Smoothed {
    ewma: f64,
    published: f64,
    at_ms: u64,
    /// The score last observed: the EWMA moves toward it.
    score: f64,
    /// The last table that listed the endpoint (Unix ms): the state of one it no longer
    /// lists is dropped.
    listed_ms: u64,
    /// The endpoint's performance in that table: its weight is this × the factor.
    perf: f64,
    /// Whether its node is labelled `priority=low` in that table.
    low: bool,
    /// What its member holds (CPU millis, memory bytes, GPUs), from its template in
    /// that table: the capacity of every reweighed table reads it here, hundreds of
    /// times a second in a process hosting many apps.
    resources: [f64; 3],
}

impl Smoothed {
    /// Observes `score` (in 0..=1) at `now_ms`; the factor shown after.
    fn observe(&mut self, score: f64, now_ms: u64) -> f64 {
        let dt = now_ms.saturating_sub(self.at_ms) as f64;
        let alpha = 1.0 - (-dt / TAU_MS).exp();
        self.ewma += alpha * (score - self.ewma);
        self.at_ms = now_ms;
        self.score = score;
        if (self.ewma - self.published).abs() > BAND {
            self.published = self.ewma;
        }
        self.published = self.published.max(FLOOR);
        self.published
    }

    /// The EWMA after `dt` ms is `score - gap·e^(-dt/τ)`, with `gap` = score − EWMA now;
    /// it leaves the band around the factor shown once `|gap|·e^(-dt/τ)` < `|score − shown|
    /// − BAND`.
    fn next_change_ms(&self) -> Option<u64> {
        // The EWMA heads for the score itself; the floor applies to what is shown after.
        let reach = (self.score - self.published).abs() - BAND;
        if reach <= 1e-9 {
            return None;
        }
        let gap = (self.score - self.ewma).abs();
        let dt = if gap <= reach { 0.0 } else { TAU_MS * (gap / reach).ln() };
        // A millisecond past the crossing, so rounding never leaves the EWMA short of it.
        Some(self.at_ms.saturating_add(dt.ceil() as u64 + 1))
    }
}

/// Per-endpoint smoothing state, kept across tables.
#[derive(Debug, Default, Clone)]
pub struct Weights {
    smoothed: HashMap<String, Smoothed, foldhash::fast::RandomState>,
    /// When the last table was computed: a factor not computed since (its member gets 0
    /// now) keeps its state, but no timer.
    table_ms: u64,
}

impl Weights {
    /// `endpoint`'s state after observing `score` at `now_ms`: its health factor is
    /// `published`.
    fn observe(&mut self, endpoint: &str, score: f64, now_ms: u64) -> &mut Smoothed {
        let score = if score.is_finite() { score.clamp(0.0, 1.0) } else { 0.0 };
        // Looked up, then inserted only when new: an entry would copy the key every time.
        if self.smoothed.contains_key(endpoint) {
            let s = self.smoothed.get_mut(endpoint).unwrap_or_else(|| unreachable!("just found"));
            s.observe(score, now_ms);
            return s;
        }
        let fresh = Smoothed {
            ewma: score,
            published: score.max(FLOOR),
            at_ms: now_ms,
            score,
            listed_ms: now_ms,
            perf: 1.0,
            low: false,
            resources: [0.0; 3],
        };
        self.smoothed.entry(endpoint.to_string()).or_insert(fresh)
    }

    /// `routes` (the last table, or one reweighed since) with the weights whose factor
    /// drifted by `now_ms` moved, as computing the table again would while the view and
    /// the units stay as they were; `None` when none moved. A change of either computes
    /// the whole table ([`Weights::table`]), which this never replaces.
    pub fn reweigh(&mut self, routes: &[v1::Route], now_ms: u64) -> Option<Vec<v1::Route>> {
        let mut moved: Vec<(usize, f64)> = Vec::new();
        for (i, r) in routes.iter().enumerate() {
            let Some(s) = self.smoothed.get_mut(r.endpoint.as_str()).filter(|s| s.at_ms >= self.table_ms) else {
                continue;
            };
            // Observed whatever the weight (a performance of 0 gives 0), so every timer
            // `next_change_ms` names is used up here.
            let before = s.published;
            let factor = s.observe(s.score, now_ms);
            if factor != before && r.weight > 0.0 {
                moved.push((i, s.perf * factor));
            }
        }
        if moved.is_empty() {
            return None;
        }
        let mut routes = routes.to_vec();
        for (i, weight) in moved {
            routes[i].weight = weight;
        }
        Some(routes)
    }

    /// When (Unix ms) a factor shown next moves with no new score: its EWMA, on its way
    /// to a score outside the band around the factor, leaves the band. The table must be
    /// computed again then, not only when the view changes; `None` when no factor moves.
    pub fn next_change_ms(&self) -> Option<u64> {
        self.smoothed.values().filter(|s| s.at_ms >= self.table_ms).filter_map(Smoothed::next_change_ms).min()
    }

    /// Every serving member of the app's units with its weight. `template`: the member's
    /// template as it runs (its alternative), whose `performance` comes before the node's.
    pub fn table<'t>(
        &mut self,
        units: &[&UnitRecord],
        serving_roles: &[String],
        slots: &[Arc<ShardSlot>],
        performance: &Performance,
        template: &dyn Fn(&MemberRecord) -> Option<Cow<'t, MemberTemplate>>,
        now_ms: u64,
    ) -> Vec<v1::Route> {
        self.table_ms = now_ms;
        let mut routes = Vec::new();
        for u in units {
            let unit_serves = matches!(u.state, UnitState::Running | UnitState::Degraded);
            for m in u.members.iter().filter(|m| serving_roles.contains(&m.role)) {
                let (Some(endpoint), Some(node), Some(shard)) = (&m.address, &m.node_id, m.shard) else { continue };
                if !unit_serves && !matches!(u.state, UnitState::Draining | UnitState::Failed | UnitState::Stopping) {
                    continue;
                }
                let record = slots
                    .get(shard as usize)
                    .filter(|slot| slot.connected)
                    .and_then(|slot| slot.view.get(node).cloned());
                let serving = unit_serves && m.state.as_deref() == Some("running");
                let weight = match record {
                    Some(r) if serving && r.status == NodeStatus::Alive && r.incarnation.0 == m.incarnation => {
                        let template = template(m);
                        let perf = template.as_ref().and_then(|t| t.performance).unwrap_or_else(|| {
                            match performance.is_empty() {
                                true => 1.0,
                                false => performance.estimate(r.labels.get("gpu_model"), r.capacity.cpu_millis / 1000),
                            }
                        });
                        let s = self.observe(endpoint, f64::from(r.health_score()), now_ms);
                        s.perf = perf;
                        s.low = r.labels.get("priority") == Some("low");
                        s.resources = template.map_or([0.0; 3], |t| {
                            let r = t.resources();
                            [r.cpu_millis as f64, r.memory_bytes as f64, f64::from(r.gpu)]
                        });
                        s.listed_ms = now_ms;
                        perf * s.published
                    }
                    _ => {
                        if let Some(s) = self.smoothed.get_mut(endpoint.as_str()) {
                            s.listed_ms = now_ms;
                        }
                        0.0
                    }
                };
                routes.push(v1::Route {
                    endpoint: endpoint.clone(),
                    node_id: node.clone(),
                    unit_id: u.unit_id.clone(),
                    member: m.member.clone(),
                    weight,
                    version: u.template.clone().unwrap_or_default(),
                });
            }
        }
        self.smoothed.retain(|_, s| s.listed_ms == now_ms);
        routes.sort_by(|a, b| a.endpoint.cmp(&b.endpoint));
        routes
    }
}

/// The app's serving capacity: route weights summed by the priority of each member's
/// node (`high` unless labelled `priority=low`), with each member's resources scaled by
/// its weight; both as `weights` found them computing the table (or the one `table`
/// reweighs). A consumer that paces itself by it slows down as low-priority capacity is
/// taken back, and speeds up as units come.
pub fn capacity(table: &v1::RouteTable, weights: &Weights) -> v1::Capacity {
    let mut by: [(f64, [f64; 3]); 2] = Default::default();
    for r in table.routes.iter().filter(|r| r.weight > 0.0) {
        let (low, resources) =
            weights.smoothed.get(r.endpoint.as_str()).map_or((false, [0.0; 3]), |s| (s.low, s.resources));
        let (weight, res) = &mut by[usize::from(low)];
        *weight += r.weight;
        for (acc, v) in res.iter_mut().zip(resources) {
            *acc += r.weight * v;
        }
    }
    let by_priority = ["high", "low"]
        .into_iter()
        .zip(by)
        .map(|(priority, (weight, [cpu, memory, gpu]))| v1::PriorityCapacity {
            priority: priority.into(),
            weight,
            resources: Some(v1::Resources {
                cpu_millis: cpu.round() as u64,
                memory_bytes: memory.round() as u64,
                gpu: gpu.round() as u32,
                ..Default::default()
            }),
        })
        .collect::<Vec<_>>();
    v1::Capacity {
        app: table.app.clone(),
        version: table.version,
        total_weight: by_priority.iter().map(|p| p.weight).sum(),
        by_priority,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_core::{Labels, Resources};
    use flotilla_view::NodeRecord;

    fn slots(nodes: &[(&str, NodeStatus, u16, Option<&str>)]) -> Vec<Arc<ShardSlot>> {
        let records = nodes.iter().map(|(id, status, health, gpu)| {
            let mut labels = Labels::new();
            if let Some(g) = gpu {
                labels.insert("gpu_model", g).unwrap();
            }
            NodeRecord {
                status: *status,
                health_millis: *health,
                labels: Arc::new(labels),
                capacity: Resources { cpu_millis: 8000, ..Default::default() }.into(),
                ..crate::testing::node(id)
            }
        });
        crate::testing::slots(records, true)
    }

    fn unit(id: &str, state: UnitState, node: &str, member_state: &str) -> UnitRecord {
        let mut u = crate::testing::unit(id, 1, state, &[("head", node)]);
        u.members[0].state = Some(member_state.into());
        u
    }

    #[test]
    fn jitter_inside_the_band_never_changes_a_weight() {
        let mut w = Weights::default();
        assert_eq!(w.observe("e", 0.8, 0).published, 0.8);
        for (i, s) in [0.85, 0.75, 0.88, 0.72, 0.8, 0.89, 0.71].iter().enumerate() {
            assert_eq!(w.observe("e", *s, 1000 * (i as u64 + 1)).published, 0.8, "sample {s}");
        }
    }

    #[test]
    fn a_lasting_drop_moves_the_weight_smoothly_down_to_the_floor() {
        let mut w = Weights::default();
        w.observe("e", 1.0, 0);
        let blip = w.observe("e", 0.3, 300).published;
        assert_eq!(blip, 1.0, "a blip of a bad score stays inside the band");
        let after_3s = w.observe("e", 0.3, 3000).published;
        assert!(after_3s < 1.0 && after_3s > 0.3, "{after_3s}");
        let much_later = w.observe("e", 0.0, 60_000).published;
        assert_eq!(much_later, FLOOR, "never below the floor");
    }

    #[test]
    fn reweighing_moves_the_weights_as_a_new_table_would() {
        let perf = Performance { cores: [("8".to_string(), 2.0)].into_iter().collect(), ..Default::default() };
        let units = [unit("u1", UnitState::Running, "n1", "running"), unit("u2", UnitState::Running, "n2", "running")];
        let refs: Vec<&UnitRecord> = units.iter().collect();
        let table = |w: &mut Weights, s: &[Arc<ShardSlot>], now: u64| {
            w.table(&refs, &["head".into()], s, &perf, &|_| None, now)
        };
        let mut w = Weights::default();
        table(&mut w, &slots(&[("n1", NodeStatus::Alive, 1000, None), ("n2", NodeStatus::Alive, 1000, None)]), 0);
        // n1's score drops: the view changed, so the whole table is computed.
        let s = slots(&[("n1", NodeStatus::Alive, 300, None), ("n2", NodeStatus::Alive, 1000, None)]);
        let mut routes = table(&mut w, &s, 1000);
        let mut steps = 0;
        while let Some(at) = w.next_change_ms() {
            let mut again = w.clone();
            let fresh = table(&mut again, &s, at);
            routes = w.reweigh(&routes, at).unwrap_or_else(|| panic!("a factor moves at {at}"));
            assert_eq!(routes, fresh, "at {at}");
            steps += 1;
            assert!(steps < 20);
        }
        assert!(steps >= 2, "{steps}");
        let weight = |node: &str| routes.iter().find(|r| r.node_id == node).map_or(0.0, |r| r.weight);
        assert!((weight("n1") / 2.0 - 0.3).abs() <= BAND, "n1's weight came within the band of 2 × its score");
        assert_eq!(weight("n2"), 2.0);
        assert_eq!(w.reweigh(&routes, 120_000), None, "settled: nothing moves");
    }

    #[test]
    fn a_factor_above_the_floor_still_falls_to_it_when_the_score_is_below() {
        let s = Smoothed {
            ewma: 0.18,
            published: 0.18,
            at_ms: 0,
            score: 0.0,
            listed_ms: 0,
            perf: 1.0,
            low: false,
            resources: [0.0; 3],
        };
        let at = s.next_change_ms().expect("0.18 has to fall to the floor");
        let (mut before, mut after) = (s, s);
        assert_eq!(before.observe(0.0, at - 2), 0.18);
        assert_eq!(after.observe(0.0, at), FLOOR);
        assert_eq!(after.next_change_ms(), None);
        // A performance of 0 gives a weight of 0, but its timer is used up all the same.
        let mut w = Weights::default();
        w.smoothed.insert("e".into(), s);
        let routes = vec![v1::Route { endpoint: "e".into(), weight: 0.0, ..Default::default() }];
        assert_eq!(w.reweigh(&routes, at), None, "a weight of 0 stays 0");
        assert_eq!(w.next_change_ms(), None);
    }

    #[test]
    fn the_next_change_is_when_the_factor_moves() {
        let mut w = Weights::default();
        w.observe("e", 1.0, 0);
        assert_eq!(w.next_change_ms(), None);
        w.observe("e", 0.92, 1000);
        assert_eq!(w.next_change_ms(), None, "jitter inside the band never moves the factor");
        let mut shown = w.observe("e", 0.3, 2000).published;
        let mut changes = 0;
        while let Some(at) = w.next_change_ms() {
            assert!(at < 60_000, "it settles");
            // A moment before, the factor holds; at the moment, it moves.
            let mut early = Weights { smoothed: w.smoothed.clone(), table_ms: 0 };
            assert_eq!(early.observe("e", 0.3, at - 2).published, shown, "at {at}");
            let now = w.observe("e", 0.3, at).published;
            assert!(now < shown, "{now} at {at}");
            shown = now;
            changes += 1;
        }
        assert!(changes >= 2, "{changes} steps down");
        assert!((shown - 0.3).abs() <= BAND);
        let at = w.next_change_ms().unwrap_or(0);
        assert_eq!(at, 0);
        w.observe("e", 0.0, 40_000);
        while let Some(at) = w.next_change_ms() {
            w.observe("e", 0.0, at);
        }
        assert_eq!(w.observe("e", 0.0, 100_000).published, FLOOR, "at the floor with a score below it, nothing moves");
        assert_eq!(w.next_change_ms(), None);
    }

    #[test]
    fn unhealthy_or_leaving_members_get_zero_at_once() {
        let s = slots(&[
            ("n1", NodeStatus::Alive, 1000, None),
            ("n2", NodeStatus::Suspect, 1000, None),
            ("n3", NodeStatus::Draining, 1000, None),
            ("n4", NodeStatus::Alive, 1000, None),
        ]);
        let units = [
            unit("u1", UnitState::Running, "n1", "running"),
            unit("u2", UnitState::Running, "n2", "running"),
            unit("u3", UnitState::Running, "n3", "running"),
            unit("u4", UnitState::Draining, "n4", "running"),
            unit("u5", UnitState::Running, "n1", "starting"),
        ];
        let refs: Vec<&UnitRecord> = units.iter().collect();
        let mut w = Weights::default();
        let t = w.table(&refs, &["head".into()], &s, &Performance::default(), &|_| None, 0);
        let weights: Vec<(String, f64)> = t.iter().map(|r| (r.unit_id.clone(), r.weight)).collect();
        assert_eq!(
            weights,
            vec![("u1".into(), 1.0), ("u5".into(), 0.0), ("u2".into(), 0.0), ("u3".into(), 0.0), ("u4".into(), 0.0),]
        );
    }

    #[test]
    fn performance_by_gpu_model_then_cores() {
        let p = Performance {
            gpu_model: [("a100".to_string(), 4.0)].into_iter().collect(),
            cores: [("4".to_string(), 1.0), ("8".to_string(), 2.0)].into_iter().collect(),
        };
        assert_eq!(p.estimate(Some("a100"), 2), 4.0);
        assert_eq!(p.estimate(Some("t4"), 16), 2.0);
        assert_eq!(p.estimate(None, 4), 1.0);
        assert_eq!(p.estimate(None, 2), 1.0, "nothing matches");
        let s = slots(&[("n1", NodeStatus::Alive, 500, Some("a100"))]);
        let u = unit("u1", UnitState::Running, "n1", "running");
        let t = Weights::default().table(&[&u], &["head".into()], &s, &p, &|_| None, 0);
        assert_eq!(t[0].weight, 2.0, "4 × 0.5");
    }

    #[test]
    fn capacity_sums_weights_by_node_priority() {
        // n2 is a low-priority node.
        let mut labels = Labels::new();
        labels.insert("priority", "low").unwrap();
        let n2 = NodeRecord { labels: Arc::new(labels), ..crate::testing::node("n2") };
        let s = crate::testing::slots([crate::testing::node("n1"), n2, crate::testing::node("n3")], true);
        let units = ["n1", "n2", "n3"].map(|n| unit(&format!("u-{n}"), UnitState::Running, n, "running"));
        let spec = r#"
            name = "a"
            units = { min = 1, max = 3, initial = 3 }
            [unit.head]
            command = "serve"
            cpu = "1"
            memory = "1Gi"
        "#;
        let template = crate::spec::AppSpec::parse(spec).unwrap().unit.head;
        let mut w = Weights::default();
        let refs: Vec<&UnitRecord> = units.iter().collect();
        let routes =
            w.table(&refs, &["head".into()], &s, &Performance::default(), &|_| Some(Cow::Borrowed(&template)), 0);
        assert_eq!(routes.iter().map(|r| r.weight).collect::<Vec<_>>(), [1.0, 1.0, 1.0]);
        // As a reweigh might leave it: n2's weight halved, n3's member out.
        let mut t = v1::RouteTable { app: "a".into(), version: 7, routes, ..Default::default() };
        t.routes[1].weight = 0.5;
        t.routes[2].weight = 0.0;
        let c = capacity(&t, &w);
        assert_eq!((c.app.as_str(), c.version, c.total_weight), ("a", 7, 1.5));
        let [high, low] = [&c.by_priority[0], &c.by_priority[1]];
        assert_eq!((high.priority.as_str(), high.weight), ("high", 1.0));
        assert_eq!((low.priority.as_str(), low.weight), ("low", 0.5));
        assert_eq!(high.resources.as_ref().map(|r| (r.cpu_millis, r.memory_bytes)), Some((1000, 1 << 30)));
        assert_eq!(low.resources.as_ref().map(|r| (r.cpu_millis, r.memory_bytes)), Some((500, 1 << 29)));
    }
}
