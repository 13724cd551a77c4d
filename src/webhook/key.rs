//! The key of a webhook decision: every input of the decision, written so that no two
//! different inputs write the same bytes. The review writes it ([`super::review`]), the memo
//! keeps answers under it ([`super::memo`]).

/// Keys longer than this are not remembered: such pods are rare, and each would take much of
/// the budget.
pub const MAX_KEY_BYTES: usize = 4096;

/// Writes the inputs of a decision into a key, each part length-prefixed so that no two
/// different inputs write the same bytes.
#[derive(Default)]
pub struct KeyWriter(Vec<u8>);

impl KeyWriter {
    pub fn part(&mut self, bytes: &[u8]) -> &mut Self {
        let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        self.0.extend_from_slice(&len.to_le_bytes());
        self.0.extend_from_slice(bytes);
        self
    }

    /// An optional part: absent and empty are different inputs.
    pub fn optional(&mut self, bytes: Option<&[u8]>) -> &mut Self {
        match bytes {
            None => self.0.push(0),
            Some(b) => {
                self.0.push(1);
                self.part(b);
            }
        }
        self
    }

    /// How many parts a list that follows has.
    pub fn count(&mut self, n: usize) -> &mut Self {
        self.0.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
        self
    }

    /// The key, unless it grew past [`MAX_KEY_BYTES`].
    pub fn finish(self) -> Option<Vec<u8>> {
        (self.0.len() <= MAX_KEY_BYTES).then_some(self.0)
    }

    /// Bytes written so far.
    #[cfg(test)]
    fn written(&self) -> usize {
        self.0.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_length_prefixed_so_different_splits_differ() {
        let mut a = KeyWriter::default();
        a.part(b"ab").part(b"c");
        let mut b = KeyWriter::default();
        b.part(b"a").part(b"bc");
        assert_ne!(a.finish(), b.finish());
        let mut absent = KeyWriter::default();
        absent.optional(None);
        let mut empty = KeyWriter::default();
        empty.optional(Some(b""));
        assert_ne!(absent.finish(), empty.finish());
    }

    #[test]
    fn keys_over_the_limit_are_not_kept() {
        let mut k = KeyWriter::default();
        k.part(&vec![b'x'; MAX_KEY_BYTES]);
        assert!(k.written() > MAX_KEY_BYTES);
        assert!(k.finish().is_none());
    }
}
