//! dlock's stand-in for the `regex` crate, on `regex-lite`: exactly the API `mysql_common` uses
//! (`bytes::Regex::new`, `is_match`, `captures`, `Captures::get`, `Match::as_bytes`).
//!
//! `mysql_common` compiles eleven patterns (two server-version regexes on every process's first
//! handshake, seven date/time ones when a value is converted, two PEM ones for RSA keys); with `regex`
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

        /// Every pattern mysql_common 0.37 compiles (`.ci/run` fails when its source has
        /// another count of `Regex::new(`), with what each must and must not match.
        /// A pattern, haystacks it must match, haystacks it must not.
        type Case = (
            &'static str,
            &'static [&'static [u8]],
            &'static [&'static [u8]],
        );

        const PATTERNS: &[Case] = &[
            (
                r"^\d{4}-\d{2}-\d{2}$",
                &[b"2026-11-23"],
                &[b"2026-11-2", b"2026-11-23 ", b"\xff"],
            ),
            (
                r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}$",
                &[b"2026-11-23 10:20:30"],
                &[b"2026-11-23T10:20:30", b"2026-11-23 10:20:3"],
            ),
            (
                r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{1,6}$",
                &[b"2026-11-23 10:20:30.1", b"2026-11-23 10:20:30.123456"],
                &[b"2026-11-23 10:20:30.1234567", b"2026-11-23 10:20:30."],
            ),
            (
                r"^\d{2}:[0-5]\d:[0-5]\d$",
                &[b"23:59:59"],
                &[b"23:60:00", b"123:00:00"],
            ),
            (
                r"^\d{2}:[0-5]\d:[0-5]\d\.\d{1,6}$",
                &[b"12:34:56.789"],
                &[b"12:34:56.789\xff", "12:34:5\u{0663}.7".as_bytes()],
            ),
            (
                r"^[0-8]\d\d:[0-5]\d:[0-5]\d$",
                &[b"838:59:59"],
                &[b"938:00:00", b"83:00:00"],
            ),
            (
                r"^[0-8]\d\d:[0-5]\d:[0-5]\d\.\d{1,6}$",
                &[b"100:00:00.5"],
                &[b"100:00:00", b"100:00:00.1234567"],
            ),
            (
                r"^(?:5.5.5-)?(\d{1,2})\.(\d{1,2})\.(\d{1,3})-MariaDB",
                &[b"5.5.5-10.11.14-MariaDB-0+deb12u2", b"11.4.2-MariaDB"],
                &[b"8.0.36", b"10.11-MariaDB"],
            ),
            (
                r"^(\d{1,2})\.(\d{1,2})\.(\d{1,3})(.*)",
                &[b"8.0.36-0ubuntu", b"10.11.14-MariaDB"],
                &[b"8.0", b"v8.0.36", b"8.0.36-\xff"],
            ),
            (
                "-----BEGIN RSA PUBLIC KEY-----([^-]*)-----END RSA PUBLIC KEY-----",
                &[b"-----BEGIN RSA PUBLIC KEY-----\nMIIB\n-----END RSA PUBLIC KEY-----\n"],
                &[b"-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----"],
            ),
            (
                "-----BEGIN PUBLIC KEY-----([^-]*)-----END PUBLIC KEY-----",
                &[b"-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----\n"],
                &[b"-----BEGIN RSA PUBLIC KEY-----\nMIIB\n-----END RSA PUBLIC KEY-----"],
            ),
        ];

        #[test]
        fn every_pattern_mysql_common_compiles_matches_as_regex_would() {
            for (pattern, yes, no) in PATTERNS {
                let re = Regex::new(pattern).unwrap();
                for h in *yes {
                    assert!(re.is_match(h), "{pattern} should match {h:?}");
                    assert!(re.captures(h).is_some(), "{pattern} captures {h:?}");
                }
                for h in *no {
                    assert!(!re.is_match(h), "{pattern} should not match {h:?}");
                    assert!(re.captures(h).is_none(), "{pattern} captures {h:?}");
                }
            }
        }

        #[test]
        fn captures_are_the_groups_mysql_common_reads() {
            let maria = Regex::new(PATTERNS[7].0).unwrap();
            let c = maria.captures(b"5.5.5-10.11.14-MariaDB-0+deb12u2").unwrap();
            assert_eq!(c.get(1).unwrap().as_bytes(), b"10");
            assert_eq!(c.get(2).unwrap().as_bytes(), b"11");
            assert_eq!(c.get(3).unwrap().as_bytes(), b"14");
            let version = Regex::new(PATTERNS[8].0).unwrap();
            let c = version.captures(b"8.0.36-0ubuntu").unwrap();
            assert_eq!(c.get(1).unwrap().as_bytes(), b"8");
            assert_eq!(c.get(4).unwrap().as_bytes(), b"-0ubuntu");
            let pem = Regex::new(PATTERNS[10].0).unwrap();
            let c = pem
                .captures(b"-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----")
                .unwrap();
            assert_eq!(c.get(1).unwrap().as_bytes(), b"\nMIIB\n");
        }
    }
}
