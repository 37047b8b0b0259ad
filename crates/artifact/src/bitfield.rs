//! Which pieces a node holds: one bit a piece, sent to the tracker as hex.

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Bitfield {
    len: u32,
    words: Vec<u64>,
}

impl Bitfield {
    pub fn new(len: u32) -> Bitfield {
        Bitfield { len, words: vec![0; (len as usize).div_ceil(64)] }
    }

    pub fn full(len: u32) -> Bitfield {
        let mut b = Bitfield::new(len);
        (0..len).for_each(|i| b.set(i));
        b
    }

    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, i: u32) -> bool {
        i < self.len && self.words[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    pub fn set(&mut self, i: u32) {
        if i < self.len {
            self.words[(i / 64) as usize] |= 1 << (i % 64);
        }
    }

    pub fn count(&self) -> u32 {
        self.words.iter().map(|w| w.count_ones()).sum()
    }

    pub fn is_full(&self) -> bool {
        self.count() == self.len
    }

    pub fn ones(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.len).filter(|i| self.get(*i))
    }

    /// Lowest piece first, two hex digits a byte.
    pub fn to_hex(&self) -> String {
        let bytes = (self.len as usize).div_ceil(8);
        (0..bytes).map(|b| format!("{:02x}", (self.words[b / 8] >> ((b % 8) * 8)) as u8)).collect()
    }

    /// Reads what [`Bitfield::to_hex`] wrote, for `len` pieces: the wrong length, a
    /// non-hex digit or a bit past `len` is an error.
    pub fn from_hex(s: &str, len: u32) -> Result<Bitfield, String> {
        let bytes = (len as usize).div_ceil(8);
        if s.len() != 2 * bytes {
            return Err(format!("a bitfield of {len} pieces is {} hex digits, not {}", 2 * bytes, s.len()));
        }
        let mut out = Bitfield::new(len);
        for (b, pair) in s.as_bytes().chunks(2).enumerate() {
            // (from_str_radix alone would take a `+` sign.)
            let v = std::str::from_utf8(pair)
                .ok()
                .filter(|p| p.bytes().all(|b| b.is_ascii_hexdigit()))
                .and_then(|p| u8::from_str_radix(p, 16).ok())
                .ok_or_else(|| "the bitfield is not hex".to_string())?;
            out.words[b / 8] |= u64::from(v) << ((b % 8) * 8);
        }
        if out.ones().count() as u32 != out.count() {
            return Err(format!("the bitfield sets pieces past the last ({len})"));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_round_trip_through_hex_and_stray_bits_are_refused() {
        let mut b = Bitfield::new(70);
        [0, 9, 63, 64, 69].iter().for_each(|i| b.set(*i));
        b.set(70);
        assert_eq!(b.count(), 5);
        assert_eq!(b.ones().collect::<Vec<_>>(), vec![0, 9, 63, 64, 69]);
        assert_eq!(Bitfield::from_hex(&b.to_hex(), 70).unwrap(), b);
        assert!(Bitfield::from_hex(&b.to_hex(), 71).is_ok());
        assert!(Bitfield::from_hex(&b.to_hex(), 69).is_err(), "piece 69 is past the last of 69");
        assert!(Bitfield::from_hex(&b.to_hex(), 80).unwrap_err().contains("hex digits"));
        assert!(Bitfield::from_hex("ff", 3).unwrap_err().contains("past the last"));
        assert!(Bitfield::from_hex("zz", 8).unwrap_err().contains("not hex"));
        assert!(Bitfield::from_hex("+1", 8).unwrap_err().contains("not hex"), "a sign is no hex digit");
        assert!(Bitfield::full(10).is_full() && Bitfield::new(0).is_full());
    }
}
