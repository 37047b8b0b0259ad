//! The heartbeat's body, decoded without prost's generic loop.
//!
//! Every heartbeat's body is decoded on the shard's receive thread, where prost's merge
//! loop and its per-field dispatch were ~3 % of the shard's CPU at 100k nodes
//! (BENCHMARKS.md). The fields agents write are read here directly; anything else (an
//! unknown field, another wire type, a key or varint longer than agents write, a length
//! past the end) goes to prost, so what is accepted, refused and produced stays exactly
//! prost's. `fast` only ever answers where prost would answer the same.

use prost::Message;

use crate::v1;

/// Decodes a heartbeat body as prost would.
pub fn decode(buf: &[u8]) -> Result<v1::HeartbeatBody, prost::DecodeError> {
    match fast(buf) {
        Some(body) => Ok(body),
        None => v1::HeartbeatBody::decode(buf),
    }
}

/// The body, if it holds only the fields agents write, each with its own wire type and a
/// one-byte key; `None` otherwise. Repeated fields merge as protobuf says (the last
/// scalar wins; a repeated sample merges field by field).
pub fn fast(mut buf: &[u8]) -> Option<v1::HeartbeatBody> {
    let mut body = v1::HeartbeatBody::default();
    while let [key, rest @ ..] = buf {
        buf = match *key {
            // Field 1, length-delimited: the health sample.
            0x0a => {
                let (len, rest) = varint(rest)?;
                let inner = rest.get(..usize::try_from(len).ok()?)?;
                health(inner, body.health.get_or_insert_with(Default::default))?;
                &rest[inner.len()..]
            }
            // Fields 2 and 3, varints.
            0x10 => {
                let (v, rest) = varint(rest)?;
                body.assignment_version = v;
                rest
            }
            0x18 => {
                let (v, rest) = varint(rest)?;
                body.sent_at_unix_ms = v;
                rest
            }
            _ => return None,
        };
    }
    Some(body)
}

/// Merges a health sample's fields into `h`.
fn health(mut buf: &[u8], h: &mut v1::HealthSample) -> Option<()> {
    while let [key, rest @ ..] = buf {
        let field = match *key {
            // Field 5, a varint: any non-zero value is true.
            0x28 => {
                let (v, rest) = varint(rest)?;
                h.preemption_notice = v != 0;
                buf = rest;
                continue;
            }
            // Fields 1-4 and 6, fixed32 floats.
            0x0d => &mut h.cpu_utilisation,
            0x15 => &mut h.cpu_steal,
            0x1d => &mut h.load_per_core,
            0x25 => &mut h.memory_pressure,
            0x35 => &mut h.workload_latency_ms,
            _ => return None,
        };
        let (bytes, rest) = rest.split_first_chunk::<4>()?;
        *field = f32::from_le_bytes(*bytes);
        buf = rest;
    }
    Some(())
}

/// A varint of at most nine bytes, which prost reads alike (a tenth byte has rules of its
/// own, left to prost).
fn varint(buf: &[u8]) -> Option<(u64, &[u8])> {
    let mut v = 0u64;
    for (i, &b) in buf.iter().take(9).enumerate() {
        v |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Some((v, &buf[i + 1..]));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift64*), so failures replay.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Every field as bits: -0.0 and 0.0 (which encode alike) and NaN payloads differ.
    type Bits = (Option<([u32; 5], bool)>, u64, u64);
    fn bits(b: &v1::HeartbeatBody) -> Bits {
        let health = b.health.map(|h| {
            let floats = [h.cpu_utilisation, h.cpu_steal, h.load_per_core, h.memory_pressure, h.workload_latency_ms];
            (floats.map(f32::to_bits), h.preemption_notice)
        });
        (health, b.assignment_version, b.sent_at_unix_ms)
    }

    /// What prost makes of `buf`.
    fn prost_view(buf: &[u8]) -> Option<Bits> {
        v1::HeartbeatBody::decode(buf).ok().as_ref().map(bits)
    }

    fn sample(rng: &mut Rng) -> v1::HealthSample {
        let mut f = || f32::from_bits(rng.next() as u32);
        v1::HealthSample {
            cpu_utilisation: f(),
            cpu_steal: f(),
            load_per_core: f(),
            memory_pressure: f(),
            preemption_notice: false,
            workload_latency_ms: f(),
        }
    }

    #[test]
    fn what_agents_send_is_read_without_prost() {
        let body = v1::HeartbeatBody {
            health: Some(v1::HealthSample {
                cpu_utilisation: 0.5,
                cpu_steal: 0.01,
                load_per_core: 1.25,
                memory_pressure: 0.2,
                preemption_notice: true,
                workload_latency_ms: 12.0,
            }),
            assignment_version: 7,
            sent_at_unix_ms: 1_796_000_000_000,
        };
        let wire = body.encode_to_vec();
        assert_eq!(fast(&wire), Some(body));
        assert_eq!(decode(&wire), Ok(body));
        assert_eq!(fast(&[]), Some(v1::HeartbeatBody::default()), "an empty body is all defaults");
    }

    /// Encodings prost writes, concatenated in random order (a field repeated, samples
    /// merged), with random values: the fast path reads each, as prost does.
    #[test]
    fn random_encodings_read_as_prost_reads_them() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut read = 0;
        for _ in 0..5_000 {
            let mut wire = Vec::new();
            for _ in 0..rng.below(5) {
                let mut s = sample(&mut rng);
                s.preemption_notice = rng.below(2) == 1;
                let part = match rng.below(4) {
                    0 => v1::HeartbeatBody { health: Some(s), ..Default::default() },
                    1 => v1::HeartbeatBody { assignment_version: rng.next() >> rng.below(64), ..Default::default() },
                    2 => v1::HeartbeatBody { sent_at_unix_ms: rng.next() >> rng.below(64), ..Default::default() },
                    _ => v1::HeartbeatBody {
                        health: Some(s),
                        assignment_version: rng.next(),
                        sent_at_unix_ms: rng.below(1 << 20),
                    },
                };
                wire.extend(part.encode_to_vec());
            }
            let prost = prost_view(&wire);
            assert!(prost.is_some(), "prost reads what it wrote");
            match fast(&wire) {
                Some(b) => {
                    read += 1;
                    assert_eq!(Some(bits(&b)), prost, "{wire:02x?}");
                }
                // Only values of 2^63 and above take the tenth varint byte left to prost.
                None => assert!(wire.windows(10).any(|w| w[..9].iter().all(|&b| b >= 0x80)), "{wire:02x?}"),
            }
        }
        assert!(read > 3_000, "{read} of 5,000 read by the fast path");
    }

    /// Arbitrary bytes and damaged encodings: wherever the fast path answers, prost answers
    /// the same.
    #[test]
    fn any_bytes_the_fast_path_reads_prost_reads_alike() {
        let mut rng = Rng(0x0123_4567_89ab_cdef);
        let alphabet = [0x0a, 0x10, 0x18, 0x0d, 0x15, 0x1d, 0x25, 0x28, 0x35, 0x80, 0xff, 0x00, 0x01, 0x7f, 0x20];
        let (mut answered, mut left) = (0, 0);
        for round in 0..50_000 {
            let mut wire = if round % 2 == 0 {
                let s = sample(&mut rng);
                v1::HeartbeatBody { health: Some(s), assignment_version: rng.next(), sent_at_unix_ms: rng.next() }
                    .encode_to_vec()
            } else {
                Vec::new()
            };
            for _ in 0..rng.below(6) {
                let at = rng.below(wire.len() as u64 + 1) as usize;
                let b = alphabet[rng.below(alphabet.len() as u64) as usize];
                match rng.below(3) {
                    0 if at < wire.len() => wire[at] = b,
                    1 if at < wire.len() => {
                        wire.truncate(at);
                    }
                    _ => wire.insert(at, b),
                }
            }
            match fast(&wire) {
                Some(b) => {
                    answered += 1;
                    assert_eq!(Some(bits(&b)), prost_view(&wire), "{wire:02x?}");
                }
                None => left += 1,
            }
        }
        assert!(answered > 5_000 && left > 5_000, "both paths exercised: {answered} / {left}");
    }

    #[test]
    fn other_shapes_go_to_prost() {
        // An unknown field (9, varint) after a valid body: prost skips it, so decode does.
        let mut wire = v1::HeartbeatBody { assignment_version: 3, ..Default::default() }.encode_to_vec();
        wire.extend([0x48, 0x01]);
        assert_eq!(fast(&wire), None);
        assert_eq!(decode(&wire).map(|b| b.assignment_version), Ok(3));
        // A ten-byte varint (2^63) and a two-byte key (field 2 = 5): prost reads them.
        let ten = [0x10, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01];
        assert_eq!(fast(&ten), None);
        assert_eq!(decode(&ten).map(|b| b.assignment_version), Ok(1 << 63));
        assert_eq!(fast(&[0x90, 0x00, 0x05]), None);
        assert_eq!(decode(&[0x90, 0x00, 0x05]).map(|b| b.assignment_version), Ok(5));
        // A sample longer than the body: prost refuses it.
        assert_eq!(fast(&[0x0a, 0x05, 0x0d, 0x00]), None);
        assert!(decode(&[0x0a, 0x05, 0x0d, 0x00]).is_err());
    }
}
