//! Text built without allocating, for the guardian (see `guardian.rs` for why it may not
//! allocate): its one line on stderr, its arguments when it executes itself anew, the paths it
//! opens in /proc.

/// Up to `N - 1` bytes, always followed by a NUL; what does not fit is dropped and [`Buf::full`]
/// says so.
pub(super) struct Buf<const N: usize> {
    buf: [u8; N],
    len: usize,
    full: bool,
}

impl<const N: usize> Default for Buf<N> {
    fn default() -> Self {
        Buf {
            buf: [0; N],
            len: 0,
            full: false,
        }
    }
}

impl<const N: usize> Buf<N> {
    /// A buffer holding `bytes`.
    pub(super) fn of(bytes: &[u8]) -> Self {
        let mut b = Self::default();
        b.push(bytes);
        b
    }

    /// Appends `bytes`, or sets [`Buf::full`] if they do not fit (with the NUL).
    pub(super) fn push(&mut self, bytes: &[u8]) {
        let end = self.len.saturating_add(bytes.len());
        match self.buf.get_mut(self.len..end) {
            Some(dst) if end < N => {
                dst.copy_from_slice(bytes);
                self.len = end;
            }
            _ => self.full = true,
        }
    }

    /// Appends `v` in decimal.
    pub(super) fn number(&mut self, mut v: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i = i.saturating_sub(1);
            if let Some(d) = digits.get_mut(i) {
                *d = b'0'.saturating_add((v % 10) as u8);
            }
            v /= 10;
            if v == 0 || i == 0 {
                break;
            }
        }
        self.push(digits.get(i..).unwrap_or_default());
    }

    /// Appends `v` in decimal, with a sign when negative.
    pub(super) fn signed(&mut self, v: i64) {
        if v < 0 {
            self.push(b"-");
        }
        self.number(v.unsigned_abs());
    }

    /// How many bytes it holds (where the next push starts).
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Whether something did not fit.
    pub(super) fn full(&self) -> bool {
        self.full
    }

    /// What it holds.
    pub(super) fn bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or_default()
    }

    /// What it holds as a C string, `None` if it did not all fit.
    pub(super) fn c_str(&self) -> Option<&std::ffi::CStr> {
        if self.full {
            return None;
        }
        std::ffi::CStr::from_bytes_with_nul(self.buf.get(..=self.len)?).ok()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_overflow() {
        let mut l = Buf::<512>::default();
        l.number(0);
        l.push(b" ");
        l.signed(-42);
        l.push(b" ");
        l.number(u64::MAX);
        assert_eq!(l.bytes(), b"0 -42 18446744073709551615");
        assert!(!l.full());
        for _ in 0..100 {
            l.push(b"0123456789");
        }
        assert!(l.full() && l.len() < 512);
        assert!(l.c_str().is_none());
        let p = Buf::<16>::of(b"/proc/self");
        assert_eq!(p.c_str().unwrap().to_bytes(), b"/proc/self");
        assert!(
            Buf::<4>::of(b"abcd").c_str().is_none(),
            "no room for the NUL"
        );
    }
}
