//! dlock's stand-in for the `regex` crate, on `regex-lite`: exactly the API `mysql_common` uses
//! (`bytes::Regex::new`, `is_match`, `captures`, `Captures::get`, `Match::as_bytes`).
//!
//! `mysql_common` compiles two version regexes on every process's first handshake; with `regex`
//! that took 1.4–1.6 ms (Unicode `\d` classes and the engines `regex` builds up front), a fifth
//! of a whole `dlock run` on MySQL. `regex-lite` compiles both in ~0.07 ms. Its `\d` is ASCII,
//! which is what server versions and date strings are (and `mysql_common` parses the captured
//! digits as ASCII). A haystack that is not UTF-8 never matches (`regex` would match a prefix
//! for some patterns; server versions and date strings are ASCII, and "no match" is what
//! `mysql_common` handles anyway: an unknown version, a value that is not a date).
//!
//! Only `mysql_common` depends on `regex` in dlock's tree; a new user of more of its API fails to
//! compile here, not silently.

/// Regexes on byte strings.
pub mod bytes {
    use std::fmt;

    /// A compiled regex.
    #[derive(Clone, Debug)]
    pub struct Regex(regex_lite::Regex);

    /// Why a pattern does not compile.
    #[derive(Clone, Debug)]
    pub struct Error(regex_lite::Error);

    impl fmt::Display for Error {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            self.0.fmt(f)
        }
    }

    impl std::error::Error for Error {}

    /// The capture groups of one match.
    #[derive(Debug)]
    pub struct Captures<'h> {
        haystack: &'h [u8],
        spans: Vec<Option<(usize, usize)>>,
    }

    /// One matched group.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Match<'h> {
        haystack: &'h [u8],
        start: usize,
        end: usize,
    }

    impl Regex {
        /// Compiles `pattern`.
        pub fn new(pattern: &str) -> Result<Regex, Error> {
            regex_lite::Regex::new(pattern).map(Regex).map_err(Error)
        }

        /// Whether it matches anywhere in `haystack`.
        pub fn is_match(&self, haystack: &[u8]) -> bool {
            std::str::from_utf8(haystack).is_ok_and(|h| self.0.is_match(h))
        }

        /// The groups of the leftmost match.
        pub fn captures<'h>(&self, haystack: &'h [u8]) -> Option<Captures<'h>> {
            let caps = self.0.captures(std::str::from_utf8(haystack).ok()?)?;
            let spans = caps
                .iter()
                .map(|m| m.map(|m| (m.start(), m.end())))
                .collect();
            Some(Captures { haystack, spans })
        }
    }

    impl<'h> Captures<'h> {
        /// Group `i` (0: the whole match), if it took part in the match.
        pub fn get(&self, i: usize) -> Option<Match<'h>> {
            let (start, end) = (*self.spans.get(i)?)?;
            Some(Match {
                haystack: self.haystack,
                start,
                end,
            })
        }

        /// The number of groups, the whole match included.
        pub fn len(&self) -> usize {
            self.spans.len()
        }

        /// Never: there is always group 0.
        pub fn is_empty(&self) -> bool {
            self.spans.is_empty()
        }
    }

    impl<'h> Match<'h> {
        /// The matched bytes.
        pub fn as_bytes(&self) -> &'h [u8] {
            &self.haystack[self.start..self.end]
        }

        /// Where the match starts.
        pub fn start(&self) -> usize {
            self.start
        }

        /// Where it ends.
        pub fn end(&self) -> usize {
            self.end
        }
    }

    #[cfg(test)]
    mod tests {
        use super::Regex;

        #[test]
        fn mysql_commons_patterns() {
            let maria = Regex::new(r"^(?:5.5.5-)?(\d{1,2})\.(\d{1,2})\.(\d{1,3})-MariaDB").unwrap();
            let c = maria.captures(b"5.5.5-10.11.14-MariaDB-0+deb12u2").unwrap();
            assert_eq!(c.get(1).unwrap().as_bytes(), b"10");
            assert_eq!(c.get(2).unwrap().as_bytes(), b"11");
            assert_eq!(c.get(3).unwrap().as_bytes(), b"14");
            assert!(maria.captures(b"11.4.2-MariaDB").is_some());
            assert!(maria.captures(b"8.0.36").is_none());
            let version = Regex::new(r"^(\d{1,2})\.(\d{1,2})\.(\d{1,3})(.*)").unwrap();
            let c = version.captures(b"8.0.36-0ubuntu").unwrap();
            assert_eq!(c.get(1).unwrap().as_bytes(), b"8");
            assert_eq!(c.get(4).unwrap().as_bytes(), b"-0ubuntu");
            assert!(
                version.captures(b"8.0.36-\xff").is_none(),
                "not UTF-8: no match"
            );
            let time = Regex::new(r"^\d{2}:[0-5]\d:[0-5]\d\.\d{1,6}$").unwrap();
            assert!(time.is_match(b"12:34:56.789"));
            assert!(!time.is_match(b"12:34:56.789\xff"));
            assert!(
                !time.is_match("12:34:5\u{0663}.7".as_bytes()),
                "\\d is ASCII"
            );
        }
    }
}
