//! Kubernetes resource quantities (`500m`, `1.5`, `129e6`, `256Mi`, `1Ei`), parsed with
//! the grammar of `k8s.io/apimachinery`'s `resource.Quantity` so an app spec written for a
//! pod means the same here:
//!
//! ```text
//! quantity  ::= number suffix
//! number    ::= ["+"] (digits | digits "." | digits "." digits | "." digits)
//! suffix    ::= binarySI | decimalSI | ("e" | "E") ["+" | "-"] digits
//! binarySI  ::= "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"
//! decimalSI ::= "m" | "" | "k" | "M" | "G" | "T" | "P" | "E"
//! ```
//!
//! Arithmetic is exact (integers, no floating point), and a value finer than the unit it is
//! read into rounds up, as Kubernetes' `Value()` and `MilliValue()` do: `0.1m` of CPU is 1
//! millicore and `0.5` bytes is 1 byte. Negative quantities parse in Kubernetes but are
//! refused here, since no resource request can be negative.

use crate::{MAX_NODE_CPU_MILLIS, MAX_NODE_MEMORY_BYTES};

/// Most digits a quantity's number may have: enough for any real request, and it keeps
/// every intermediate value inside a `u128`.
const MAX_DIGITS: usize = 30;
/// The largest decimal exponent accepted (`1e18` is one exa); a larger one is not a request.
const MAX_EXPONENT: i32 = 30;

/// A CPU quantity in millicores (`500m`, `0.5`, `2`, `1e3m`).
pub fn cpu_millis(text: &str) -> Result<u64, String> {
    let q = Quantity::parse(text)?;
    q.scaled(3, MAX_NODE_CPU_MILLIS).map_err(|e| e.describe(text, "cores", MAX_NODE_CPU_MILLIS / 1000))
}

/// A memory quantity in bytes (`256Mi`, `1Gi`, `129e6`, `128974848`, `129M`).
pub fn memory_bytes(text: &str) -> Result<u64, String> {
    let q = Quantity::parse(text)?;
    q.scaled(0, MAX_NODE_MEMORY_BYTES).map_err(|e| e.describe(text, "bytes", MAX_NODE_MEMORY_BYTES))
}

/// A parsed quantity: `mantissa × 10^exp10 × 2^exp2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Quantity {
    mantissa: u128,
    exp10: i32,
    exp2: u32,
}

/// A well-formed quantity larger than any node could offer.
struct TooLarge;

impl TooLarge {
    fn describe(self, text: &str, unit: &str, max: u64) -> String {
        format!("{text:?} is more than any node has (at most {max} {unit})")
    }
}

impl Quantity {
    fn parse(text: &str) -> Result<Quantity, String> {
        let s = text.trim();
        let bad = |why: &str| format!("{text:?} is not a quantity: {why} (examples: 500m, 1.5, 129e6, 256Mi, 1Gi)");
        if s.is_empty() {
            return Err(bad("it is empty"));
        }
        let s = match s.as_bytes()[0] {
            b'+' => &s[1..],
            b'-' => return Err(format!("{text:?} is negative; a resource quantity cannot be")),
            _ => s,
        };
        let number_len = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
        let (number, suffix) = s.split_at(number_len);
        let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && frac.is_empty() {
            return Err(bad("it has no digits"));
        }
        if frac.contains('.') {
            return Err(bad("it has two decimal points"));
        }
        let digits = whole.trim_start_matches('0').len() + frac.len();
        if digits > MAX_DIGITS {
            return Err(bad(&format!("more than {MAX_DIGITS} digits")));
        }
        let mut mantissa: u128 = 0;
        for b in whole.bytes().chain(frac.bytes()) {
            // At most MAX_DIGITS significant digits, so this never overflows.
            mantissa = mantissa * 10 + u128::from(b - b'0');
        }
        let frac_digits = frac.len() as i32;
        let (exp10, exp2) = match suffix {
            "" => (0, 0),
            "m" => (-3, 0),
            "k" => (3, 0),
            "M" => (6, 0),
            "G" => (9, 0),
            "T" => (12, 0),
            "P" => (15, 0),
            "E" => (18, 0),
            "Ki" => (0, 10),
            "Mi" => (0, 20),
            "Gi" => (0, 30),
            "Ti" => (0, 40),
            "Pi" => (0, 50),
            "Ei" => (0, 60),
            "K" => return Err(bad("the suffix for kilo is a lowercase k (or Ki for 1024)")),
            _ => match suffix.strip_prefix(['e', 'E']) {
                Some(exp) => {
                    (parse_exponent(exp).ok_or_else(|| bad(&format!("{suffix:?} is not an exponent like e6")))?, 0)
                }
                None => {
                    return Err(bad(&format!(
                        "unknown suffix {suffix:?} (use m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei or e<N>)"
                    )));
                }
            },
        };
        Ok(Quantity { mantissa, exp10: exp10 - frac_digits, exp2 })
    }

    /// The value in units of `10^-unit_exp10` (3 for millis, 0 for whole units), rounded up,
    /// refused above `max`.
    fn scaled(self, unit_exp10: i32, max: u64) -> Result<u64, TooLarge> {
        if self.mantissa == 0 {
            return Ok(0);
        }
        let exp10 = self.exp10 + unit_exp10;
        let value = if exp10 >= 0 {
            10u128
                .checked_pow(exp10.unsigned_abs())
                .and_then(|p| self.mantissa.checked_mul(p))
                .and_then(|v| v.checked_mul(1u128 << self.exp2))
                .ok_or(TooLarge)?
        } else {
            // mantissa × 2^b / (2^k × 5^k), with the common twos cancelled first so that
            // only a value far above any bound can overflow the numerator.
            let k = exp10.unsigned_abs();
            let twos = k.min(self.exp2);
            let numerator = self.mantissa.checked_mul(1u128 << (self.exp2 - twos)).ok_or(TooLarge)?;
            match 5u128.checked_pow(k).and_then(|f| f.checked_mul(1u128 << (k - twos))) {
                Some(denominator) => numerator.div_ceil(denominator),
                // Below 10^-38 of the unit, yet not zero: one unit, rounded up.
                None => 1,
            }
        };
        u64::try_from(value).ok().filter(|v| *v <= max).ok_or(TooLarge)
    }
}

/// The digits after `e`/`E`, with an optional sign, within ±[`MAX_EXPONENT`].
fn parse_exponent(s: &str) -> Option<i32> {
    let (negative, digits) = match s.as_bytes().first()? {
        b'+' => (false, &s[1..]),
        b'-' => (true, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty() || digits.len() > 3 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: i32 = digits.parse().ok()?;
    (n <= MAX_EXPONENT).then_some(if negative { -n } else { n })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The examples of the Kubernetes documentation ("Resource units in Kubernetes" and
    /// "Assign Memory Resources to Containers"): these all mean about 129 MB.
    #[test]
    fn the_kubernetes_documentation_examples() {
        assert_eq!(memory_bytes("128974848"), Ok(128_974_848));
        assert_eq!(memory_bytes("129e6"), Ok(129_000_000));
        assert_eq!(memory_bytes("129M"), Ok(129_000_000));
        assert_eq!(memory_bytes("128974848000m"), Ok(128_974_848));
        assert_eq!(memory_bytes("123Mi"), Ok(123 << 20));
        assert_eq!(memory_bytes("400m"), Ok(1), "0.4 bytes rounds up, as Value() does");
        assert_eq!(cpu_millis("0.1"), Ok(100));
        assert_eq!(cpu_millis("100m"), Ok(100));
        assert_eq!(cpu_millis("1"), Ok(1000));
        assert_eq!(cpu_millis("0.5"), Ok(500));
        assert_eq!(cpu_millis("250m"), Ok(250));
    }

    #[test]
    fn every_suffix_and_number_form() {
        for (text, bytes) in [
            ("1k", 1_000u64),
            ("1M", 1_000_000),
            ("1G", 1_000_000_000),
            ("1T", 1_000_000_000_000),
            ("0.00001P", 10_000_000_000),
            ("0.000001Pi", 1_125_899_907),
            ("1Ki", 1 << 10),
            ("1Mi", 1 << 20),
            ("1Gi", 1 << 30),
            ("1Ti", 1 << 40),
            ("0.5Gi", 1 << 29),
            (".5Gi", 1 << 29),
            ("2.Gi", 2 << 30),
            ("+1Gi", 1 << 30),
            ("1E3", 1_000),
            ("1e+3", 1_000),
            ("15e-1", 2),
            ("0", 0),
            ("000.000", 0),
            (" 64Mi ", 64 << 20),
        ] {
            assert_eq!(memory_bytes(text), Ok(bytes), "{text}");
        }
        assert_eq!(cpu_millis("1.5"), Ok(1500));
        assert_eq!(cpu_millis("2e-3"), Ok(2));
        assert_eq!(cpu_millis("0.1m"), Ok(1), "finer than a millicore rounds up");
        assert_eq!(cpu_millis("1k"), Ok(1_000_000));
        assert_eq!(cpu_millis("1e3"), Ok(1_000_000));
        assert!(cpu_millis("1e3m").is_err(), "an exponent takes no further suffix");
    }

    /// `1Ei` and `1E` are valid quantities; they are refused only for being larger than any
    /// node, and the message says so.
    #[test]
    fn exa_parses_and_is_refused_for_its_size_only() {
        assert_eq!(Quantity::parse("1Ei"), Ok(Quantity { mantissa: 1, exp10: 0, exp2: 60 }));
        assert_eq!(Quantity::parse("1E"), Ok(Quantity { mantissa: 1, exp10: 18, exp2: 0 }));
        for text in ["1Ei", "1E", "65Ti", "1e30", "999999999999999999999999999999Ei"] {
            let err = memory_bytes(text).unwrap_err();
            assert!(err.contains("more than any node has"), "{text}: {err}");
        }
        assert_eq!(memory_bytes("64Ti"), Ok(64 << 40));
        assert!(cpu_millis("1e30").unwrap_err().contains("at most 4096 cores"));
    }

    #[test]
    fn malformed_quantities_say_what_is_wrong() {
        for (text, why) in [
            ("", "empty"),
            ("lots", "no digits"),
            ("3 parsecs", "unknown suffix"),
            ("1.2.3", "two decimal points"),
            ("1K", "lowercase k"),
            ("1e", "exponent"),
            ("1e1.5", "exponent"),
            ("1e99", "exponent"),
            ("1mi", "unknown suffix"),
            ("1 Gi", "unknown suffix"),
            ("-1", "negative"),
            ("1234567890123456789012345678901", "digits"),
        ] {
            let err = memory_bytes(text).unwrap_err();
            assert!(err.contains(why), "{text:?}: {err}");
        }
    }

    proptest::proptest! {
        /// Any input gives a value or an error, never a panic, and a value never exceeds the bound.
        #[test]
        fn never_panics(text in "[+-]?[0-9.]{0,35}([eE][+-]?[0-9]{0,4}|[mkMGTPE]i?)?") {
            if let Ok(v) = memory_bytes(&text) {
                proptest::prop_assert!(v <= MAX_NODE_MEMORY_BYTES);
            }
            if let Ok(v) = cpu_millis(&text) {
                proptest::prop_assert!(v <= MAX_NODE_CPU_MILLIS);
            }
        }

        /// Binary and decimal suffixes agree with plain multiplication.
        #[test]
        fn suffixes_multiply(n in 0u64..1_000_000) {
            proptest::prop_assert_eq!(memory_bytes(&format!("{n}Ki")), Ok(n << 10));
            proptest::prop_assert_eq!(memory_bytes(&format!("{n}k")), Ok(n * 1000));
            proptest::prop_assert_eq!(memory_bytes(&format!("{n}e3")), Ok(n * 1000));
            proptest::prop_assert_eq!(cpu_millis(&format!("{n}m")), Ok(n));
            proptest::prop_assert_eq!(cpu_millis(&format!("{}.{:03}", n / 1000, n % 1000)), Ok(n));
        }
    }
}
