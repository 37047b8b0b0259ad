use serde::{Deserialize, Serialize};

/// One health observation from an agent (see `flotilla.v1.HealthSample`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct HealthSample {
    pub cpu_utilisation: f32,
    /// CPU steal, or the cgroup throttled ratio, whichever is larger.
    pub cpu_steal: f32,
    pub load_per_core: f32,
    pub memory_pressure: f32,
    pub preemption_notice: bool,
    pub workload_latency_ms: f32,
}

/// A [`HealthSample`] in 12 bytes instead of 24, for the copy every view record keeps
/// (a shard holds one record per node; issue #19's 300 bytes a node). Each figure is
/// kept as a bfloat16, the upper half of its `f32` rounded to nearest: three significant
/// digits over the whole range, which is what a dashboard shows. Scores are computed
/// from the full sample before it is packed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PackedHealth {
    figures: [u16; 5],
    preemption_notice: bool,
}

impl PackedHealth {
    pub fn sample(&self) -> HealthSample {
        let [cpu_utilisation, cpu_steal, load_per_core, memory_pressure, workload_latency_ms] =
            self.figures.map(from_bf16);
        HealthSample {
            cpu_utilisation,
            cpu_steal,
            load_per_core,
            memory_pressure,
            preemption_notice: self.preemption_notice,
            workload_latency_ms,
        }
    }

    pub fn preemption_notice(&self) -> bool {
        self.preemption_notice
    }
}

impl From<HealthSample> for PackedHealth {
    fn from(s: HealthSample) -> Self {
        PackedHealth {
            figures: [s.cpu_utilisation, s.cpu_steal, s.load_per_core, s.memory_pressure, s.workload_latency_ms]
                .map(to_bf16),
            preemption_notice: s.preemption_notice,
        }
    }
}

/// `x` rounded to the nearest bfloat16 (ties to even); a NaN stays a NaN.
fn to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) as u16) | 0x0040;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

fn from_bf16(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// The health score of a sample, in [0, 1], 1 meaning fully healthy.
///
/// `score = steal × load × memory × preemption`, where
/// - steal  = clamp(1 − 2·cpu_steal, 0, 1): a node losing half its CPU to steal or
///   throttling is worth nothing;
/// - load   = 1 while load per core ≤ 1, then 1 / load_per_core (an overloaded node
///   serves proportionally slower);
/// - memory = clamp(1 − memory_pressure, 0, 1);
/// - preemption = 0 when a preemption notice is present, else 1.
///
/// Inputs that are NaN or negative count as 0 (healthy), so a broken sensor cannot
/// take a node out of service on its own.
pub fn health_score(s: &HealthSample) -> f32 {
    if s.preemption_notice {
        return 0.0;
    }
    let sane = |v: f32| if v.is_finite() && v > 0.0 { v } else { 0.0 };
    let steal = (1.0 - 2.0 * sane(s.cpu_steal)).clamp(0.0, 1.0);
    let lpc = sane(s.load_per_core);
    let load = if lpc <= 1.0 { 1.0 } else { 1.0 / lpc };
    let memory = (1.0 - sane(s.memory_pressure)).clamp(0.0, 1.0);
    (steal * load * memory).clamp(0.0, 1.0)
}

/// Publishes a score only when it leaves a band around the last published value,
/// so per-second jitter never creates a new view version. Scores are kept in
/// thousandths so they fit an atomic on the heartbeat path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hysteresis {
    /// Half-width of the band, in thousandths.
    pub band_millis: u16,
}

impl Default for Hysteresis {
    fn default() -> Self {
        Hysteresis { band_millis: 100 }
    }
}

impl Hysteresis {
    pub fn to_millis(score: f32) -> u16 {
        (score.clamp(0.0, 1.0) * 1000.0).round() as u16
    }

    /// The new published score, or `None` when `raw` stays inside the band.
    /// Reaching exactly 0 or 1 always publishes, so a recovered node gets back to full weight.
    pub fn update(&self, published_millis: u16, raw: f32) -> Option<u16> {
        let raw = Self::to_millis(raw);
        if raw == published_millis {
            return None;
        }
        let moved = raw.abs_diff(published_millis) >= self.band_millis;
        let at_edge = raw == 0 || raw == 1000;
        if moved || at_edge {
            // Round to 1/20ths so nearby values publish identically.
            Some(((u32::from(raw) + 25) / 50 * 50).min(1000) as u16)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthy_node_scores_one() {
        assert_eq!(health_score(&HealthSample::default()), 1.0);
        let busy = HealthSample { cpu_utilisation: 0.95, load_per_core: 0.9, ..Default::default() };
        assert_eq!(health_score(&busy), 1.0, "busy is not unhealthy");
    }

    #[test]
    fn each_factor_lowers_the_score() {
        let steal = HealthSample { cpu_steal: 0.25, ..Default::default() };
        assert!((health_score(&steal) - 0.5).abs() < 1e-6);
        let load = HealthSample { load_per_core: 4.0, ..Default::default() };
        assert!((health_score(&load) - 0.25).abs() < 1e-6);
        let mem = HealthSample { memory_pressure: 0.3, ..Default::default() };
        assert!((health_score(&mem) - 0.7).abs() < 1e-6);
        let pre = HealthSample { preemption_notice: true, ..Default::default() };
        assert_eq!(health_score(&pre), 0.0);
        let nan = HealthSample { cpu_steal: f32::NAN, load_per_core: -3.0, ..Default::default() };
        assert_eq!(health_score(&nan), 1.0);
    }

    #[test]
    fn a_packed_sample_keeps_three_digits_in_twelve_bytes() {
        assert_eq!(std::mem::size_of::<PackedHealth>(), 12);
        let s = HealthSample {
            cpu_utilisation: 0.4567,
            cpu_steal: 0.0123,
            load_per_core: 37.25,
            memory_pressure: 1.0,
            preemption_notice: true,
            workload_latency_ms: 1234.5,
        };
        let back = PackedHealth::from(s).sample();
        assert!(back.preemption_notice);
        for (was, is) in [
            (s.cpu_utilisation, back.cpu_utilisation),
            (s.cpu_steal, back.cpu_steal),
            (s.load_per_core, back.load_per_core),
            (s.memory_pressure, back.memory_pressure),
            (s.workload_latency_ms, back.workload_latency_ms),
        ] {
            assert!(((is - was) / was).abs() <= 1.0 / 256.0, "{was} came back as {is}");
        }
        // Packing what came out of a packing changes nothing (a record survives the wire).
        assert_eq!(PackedHealth::from(back), PackedHealth::from(s));
        assert_eq!(PackedHealth::from(HealthSample::default()), PackedHealth::default());
        assert_eq!(PackedHealth::default().sample(), HealthSample::default());
        assert!(
            PackedHealth::from(HealthSample { cpu_steal: f32::NAN, ..Default::default() }).sample().cpu_steal.is_nan()
        );
        assert_eq!(
            PackedHealth::from(HealthSample { load_per_core: f32::MAX, ..Default::default() }).sample().load_per_core,
            f32::INFINITY
        );
    }

    #[test]
    fn jitter_inside_the_band_publishes_nothing() {
        let h = Hysteresis::default();
        for raw in [0.95, 0.93, 0.97, 0.91, 0.999] {
            assert_eq!(h.update(1000, raw), None, "raw {raw}");
        }
        assert_eq!(h.update(1000, 0.7), Some(700));
        assert_eq!(h.update(700, 0.75), None);
        assert_eq!(h.update(700, 1.0), Some(1000), "full recovery always publishes");
        assert_eq!(h.update(300, 0.0), Some(0));
        assert_eq!(h.update(1000, 0.62), Some(600));
    }
}
