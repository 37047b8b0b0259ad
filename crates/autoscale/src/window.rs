//! A bounded sample history: a ring of `BUCKETS` time buckets covering one window. Each bucket
//! keeps the count, sum and maximum of its samples, so memory is fixed whatever the window and
//! interval, and an average or maximum over the window is a scan of `BUCKETS` entries.

pub(crate) const BUCKETS: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Bucket<const K: usize> {
    idx: u64,
    pub n: u32,
    pub sum: [f64; K],
    pub max: [f64; K],
}

const fn empty<const K: usize>() -> Bucket<K> {
    Bucket { idx: 0, n: 0, sum: [0.0; K], max: [f64::NEG_INFINITY; K] }
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Window<const K: usize> {
    window_ms: u64,
    span_ms: u64,
    buckets: [Bucket<K>; BUCKETS],
}

impl<const K: usize> Window<K> {
    pub fn new(window_ms: u64) -> Self {
        let span_ms = window_ms.div_ceil(BUCKETS as u64).max(1);
        Window { window_ms, span_ms, buckets: [empty(); BUCKETS] }
    }

    /// Drops every sample, and adopts `window_ms` if the policy changed it.
    pub fn reset(&mut self, window_ms: u64) {
        *self = Self::new(window_ms);
    }

    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    pub fn push(&mut self, at_ms: u64, v: [f64; K]) {
        let idx = at_ms / self.span_ms;
        let b = &mut self.buckets[(idx % BUCKETS as u64) as usize];
        if b.n == 0 || b.idx != idx {
            *b = Bucket { idx, ..empty() };
        }
        b.n += 1;
        for ((sum, max), x) in b.sum.iter_mut().zip(&mut b.max).zip(v) {
            *sum += x;
            *max = max.max(x);
        }
    }

    /// The buckets inside the window ending at `now_ms`, oldest first.
    pub fn live(&self, now_ms: u64) -> impl Iterator<Item = &Bucket<K>> {
        let now = now_ms / self.span_ms;
        let first = now.saturating_sub(BUCKETS as u64 - 1);
        (first..=now).filter_map(move |idx| {
            let b = &self.buckets[(idx % BUCKETS as u64) as usize];
            (b.n > 0 && b.idx == idx).then_some(b)
        })
    }

    /// Average of each value over the window, `None` with no sample.
    pub fn average(&self, now_ms: u64) -> Option<[f64; K]> {
        let (mut n, mut sum) = (0u32, [0.0; K]);
        for b in self.live(now_ms) {
            n += b.n;
            for (total, x) in sum.iter_mut().zip(b.sum) {
                *total += x;
            }
        }
        (n > 0).then(|| sum.map(|s| s / f64::from(n)))
    }
}
