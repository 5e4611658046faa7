//! What simulated device memory holds, and what the verification kernel finds in it.
//!
//! An allocation of up to [`SMALL_ALLOC`] bytes holds real contents (a kernel's result buffer,
//! its test data): memsets and copies write them, reads return them. A larger one is a fill
//! value: that of its last memset of the whole, or the device's background (the dirty pattern
//! while it holds another tenant's data, else zero). Over both lie the device's stale bytes
//! ([`crate::stale`]), at their offsets of the memory cleared so far.

/// Allocations up to this size hold real bytes.
pub const SMALL_ALLOC: u64 = 1024 * 1024;

pub(crate) struct Alloc {
    pub ptr: u64,
    pub size: u64,
    /// The value of the last memset of the whole allocation.
    pub fill: Option<u8>,
    /// The contents of a small allocation.
    pub data: Option<Vec<u8>>,
    /// Where the allocation starts in the memory the scrub clears: set at its first memset of
    /// the whole (allocations written only by copies, like a result buffer, have none).
    pub cleared_at: Option<u64>,
}

/// What the verification kernel reports over a range: non-zero 8-byte words (the 0-15 bytes
/// after the last whole 16 count as one word), and the offset of the first one, from the range's
/// start (for the tail: where the tail starts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Found {
    pub words: u64,
    pub first: Option<u64>,
}

impl Found {
    fn add(&mut self, offset: u64) {
        self.words += 1;
        self.first = Some(self.first.map_or(offset, |f| f.min(offset)));
    }
}

/// The kernel's rule over bytes read back: the reference the fill model is checked against.
pub fn scan(bytes: &[u8]) -> Found {
    let whole = bytes.len() / 16 * 16;
    let mut found = Found::default();
    for (i, word) in bytes[..whole].chunks(8).enumerate() {
        if word.iter().any(|b| *b != 0) {
            found.add(i as u64 * 8);
        }
    }
    if bytes[whole..].iter().any(|b| *b != 0) {
        found.add(whole as u64);
    }
    found
}

impl Alloc {
    pub fn new(ptr: u64, size: u64, background: u8) -> Alloc {
        Alloc {
            ptr,
            size,
            fill: None,
            data: (size <= SMALL_ALLOC).then(|| vec![background; size as usize]),
            cleared_at: None,
        }
    }

    /// The offset of `[p, p + n)` in this allocation, if it lies inside it.
    pub fn offset_of(&self, p: u64, n: u64) -> Option<u64> {
        let rel = p.checked_sub(self.ptr)?;
        (rel.checked_add(n)? <= self.size).then_some(rel)
    }

    /// A memset of `n` bytes at `rel`; `next_cleared`: where the memory cleared so far ends.
    /// `false`: a part of a large allocation, which the fill model cannot hold.
    pub fn set(&mut self, rel: u64, n: u64, value: u8, next_cleared: &mut u64) -> bool {
        let whole = rel == 0 && n == self.size;
        match &mut self.data {
            Some(d) => d[rel as usize..(rel + n) as usize].fill(value),
            None if !whole => return false,
            None => {}
        }
        if whole {
            self.fill = Some(value);
            if self.cleared_at.is_none() {
                self.cleared_at = Some(*next_cleared);
                *next_cleared += self.size;
            }
        }
        true
    }

    /// A copy into the allocation; `false` for a large one (no contents to write).
    pub fn write(&mut self, rel: u64, bytes: &[u8]) -> bool {
        match &mut self.data {
            Some(d) => {
                d[rel as usize..rel as usize + bytes.len()].copy_from_slice(bytes);
                true
            }
            None => false,
        }
    }

    /// `n` bytes at `rel` as a read finds them; `stale`: the device's (offset, value) pairs.
    pub fn read(&self, rel: u64, n: u64, background: u8, stale: &[(u64, u8)]) -> Vec<u8> {
        let mut out = match &self.data {
            Some(d) => d[rel as usize..(rel + n) as usize].to_vec(),
            None => vec![self.fill.unwrap_or(background); n as usize],
        };
        for (at, value) in self.stale_in(rel, n, stale) {
            out[at as usize] = value;
        }
        out
    }

    /// The stale bytes within `[rel, rel + n)`, as (offset from `rel`, value).
    fn stale_in<'a>(&self, rel: u64, n: u64, stale: &'a [(u64, u8)]) -> impl Iterator<Item = (u64, u8)> + 'a {
        let start = self.cleared_at.map(|c| c + rel);
        stale.iter().filter_map(move |&(offset, value)| {
            let at = offset.checked_sub(start?)?;
            (at < n).then_some((at, value))
        })
    }

    /// What the verification kernel reports over `n` bytes at `rel`.
    pub fn verify(&self, rel: u64, n: u64, background: u8, stale: &[(u64, u8)]) -> Found {
        if self.data.is_some() {
            return scan(&self.read(rel, n, background, stale));
        }
        let whole = n / 16 * 16;
        let fill = self.fill.unwrap_or(background);
        if fill != 0 {
            let words = whole / 8 + u64::from(n > whole);
            return Found {
                words,
                first: (n > 0).then_some(0),
            };
        }
        let mut words: Vec<u64> = self
            .stale_in(rel, n, stale)
            .filter(|(_, v)| *v != 0)
            .map(|(at, _)| if at < whole { at / 8 * 8 } else { whole })
            .collect();
        words.sort_unstable();
        words.dedup();
        Found {
            words: words.len() as u64,
            first: words.first().copied(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn large(size: u64, fill: Option<u8>, cleared_at: Option<u64>) -> Alloc {
        Alloc {
            ptr: 0x1000,
            size,
            fill,
            data: None,
            cleared_at,
        }
    }

    #[test]
    fn scan_counts_words_and_the_tail_as_the_kernel_does() {
        let mut b = vec![0u8; 16 * 3 + 5];
        assert_eq!(scan(&b), Found::default());
        b[17] = 1; // word 2 (bytes 16..24)
        b[23] = 9; // the same word
        b[40] = 7; // word 5
        b[50] = 3; // the tail (bytes 48..53)
        assert_eq!(
            scan(&b),
            Found {
                words: 3,
                first: Some(16)
            }
        );
    }

    #[test]
    fn stale_bytes_count_from_where_the_allocation_was_cleared() {
        let mut next = 4096;
        let mut a = large(1 << 20, None, None);
        assert!(a.set(0, 1 << 20, 0, &mut next));
        assert_eq!((a.cleared_at, next), (Some(4096), 4096 + (1 << 20)));
        let stale = [(4096 + 1000, 0xAB), (10, 0xCD)];
        let f = a.verify(0, 1 << 20, 0xAB, &stale);
        assert_eq!(
            f,
            Found {
                words: 1,
                first: Some(1000 / 8 * 8)
            }
        );
        assert_eq!(a.read(1000, 2, 0xAB, &stale), [0xAB, 0]);
        assert!(!a.set(8, 8, 0, &mut next), "part of a large allocation");
    }

    proptest! {
        /// The fill model answers as the kernel's rule over the bytes a read returns.
        #[test]
        fn the_fill_model_agrees_with_a_scan_of_its_bytes(
            size in 1u64..600,
            fill in proptest::option::of(prop_oneof![Just(0u8), any::<u8>()]),
            background in prop_oneof![Just(0u8), Just(0xABu8)],
            cleared in proptest::option::of(0u64..100),
            stale in proptest::collection::vec((0u64..800, 1u8..=255), 0..6),
            from in 0u64..600,
        ) {
            let a = large(size, fill, cleared);
            let rel = from % size;
            let n = size - rel;
            let bytes = a.read(rel, n, background, &stale);
            prop_assert_eq!(a.verify(rel, n, background, &stale), scan(&bytes));
        }
    }
}
