//! The part of memcached's text protocol the registry speaks: `set`,
//! `get` of one or more names, `delete` and `quit`, and their replies.
//! Both sides parse bytes from another process here, so every parser is
//! total: a complete message, [`Parsed::Incomplete`] (read more), or a
//! [`WireError`], never a panic and never more than [`MAX_LINE`] bytes of
//! line or [`MAX_VALUE`] bytes of value buffered on a peer's word.

use std::fmt::Write as _;

/// The longest name memcached accepts (its `KEY_MAX_LENGTH`).
pub const MAX_KEY: usize = 250;
/// The largest value the registry stores or accepts in a reply: an
/// endpoint is well under a kilobyte in JSON.
pub const MAX_VALUE: usize = 64 * 1024;
/// The longest command or reply line, its `\r\n` or `\n` and the data
/// block not counted.
pub const MAX_LINE: usize = 2048;
/// The most names one `get` asks for, and values one reply carries: a
/// reply cannot make a reader buffer more than this many values.
pub const MAX_VALUES: usize = 64;

/// A parser's result: the message and how many bytes it took, or a sign
/// that the buffer holds only its beginning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed<T> {
    /// More bytes are needed.
    Incomplete,
    /// The message, and the bytes of the buffer it used.
    Done(T, usize),
}

/// Why bytes are not a message of the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// A line longer than [`MAX_LINE`].
    #[error("a line longer than {MAX_LINE} bytes")]
    LineTooLong,
    /// A line that is not ASCII text.
    #[error("a line that is not ASCII text")]
    NotText,
    /// A value longer than [`MAX_VALUE`].
    #[error("a value of {0} bytes, more than the {MAX_VALUE} allowed")]
    ValueTooLarge(u64),
    /// A data block not followed by `\r\n`.
    #[error("a data block not followed by \\r\\n")]
    BadDataEnd,
    /// A name that memcached would not take.
    #[error("name {0:?}: {1}")]
    BadKey(String, &'static str),
    /// A line that is no command or reply of the protocol.
    #[error("unexpected line {0:?}")]
    Unexpected(String),
    /// A `get` of more names, or a reply of more values, than
    /// [`MAX_VALUES`].
    #[error("more than {MAX_VALUES} names in one get or reply")]
    TooManyValues,
    /// A number field that does not parse.
    #[error("{0} is not a number in {1:?}")]
    BadNumber(&'static str, String),
    /// A `get` reply carrying a name that was not asked for.
    #[error("a reply for {got:?} to a get of {asked:?}")]
    OtherKey {
        /// The name asked for.
        asked: String,
        /// The name in the reply.
        got: String,
    },
}

/// Checks `key` the way memcached does: 1 to [`MAX_KEY`] bytes, no
/// whitespace or control characters.
pub fn check_key(key: &str) -> Result<(), WireError> {
    let bad = |why| Err(WireError::BadKey(key.chars().take(64).collect(), why));
    if key.is_empty() {
        return bad("empty");
    }
    if key.len() > MAX_KEY {
        return bad("longer than 250 bytes");
    }
    if key.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return bad("holds whitespace or a control character");
    }
    Ok(())
}

/// The first line in `buf` (without its `\r\n` or `\n`) and the bytes up
/// to and including its end. A line holds at most [`MAX_LINE`] bytes, its
/// end not counted, whether it ends in `\n` or in `\r\n`: a line read with
/// a bare `\n` and written again with `\r\n` is still a line.
fn line(buf: &[u8]) -> Result<Parsed<&str>, WireError> {
    let Some(nl) = buf.iter().take(MAX_LINE + 2).position(|&b| b == b'\n') else {
        // Without a `\n` in sight, the line is too long once the buffer
        // holds more than MAX_LINE bytes that cannot all be text and `\r`.
        let too_long = buf.len() > MAX_LINE + 1 || (buf.len() > MAX_LINE && buf[MAX_LINE] != b'\r');
        return if too_long {
            Err(WireError::LineTooLong)
        } else {
            Ok(Parsed::Incomplete)
        };
    };
    let text = buf[..nl].strip_suffix(b"\r").unwrap_or(&buf[..nl]);
    if text.len() > MAX_LINE {
        return Err(WireError::LineTooLong);
    }
    if !text.is_ascii() {
        return Err(WireError::NotText);
    }
    // ASCII is UTF-8.
    let text = std::str::from_utf8(text).map_err(|_| WireError::NotText)?;
    Ok(Parsed::Done(text, nl + 1))
}

/// A data block of `len` bytes at the start of `buf`, then `\r\n`.
fn data(buf: &[u8], len: usize) -> Result<Parsed<Vec<u8>>, WireError> {
    if buf.len() < len + 2 {
        return Ok(Parsed::Incomplete);
    }
    if &buf[len..len + 2] != b"\r\n" {
        return Err(WireError::BadDataEnd);
    }
    Ok(Parsed::Done(buf[..len].to_vec(), len + 2))
}

fn number<T: std::str::FromStr>(field: &'static str, s: &str) -> Result<T, WireError> {
    s.parse()
        .map_err(|_| WireError::BadNumber(field, s.chars().take(64).collect()))
}

fn value_len(s: &str) -> Result<usize, WireError> {
    let n: u64 = number("the byte count", s)?;
    if n > MAX_VALUE as u64 {
        return Err(WireError::ValueTooLarge(n));
    }
    Ok(n as usize)
}

fn unexpected(line: &str) -> WireError {
    WireError::Unexpected(line.chars().take(80).collect())
}

/// A command, as the registry's server reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `set KEY FLAGS EXPTIME BYTES [noreply]` and its data.
    Set {
        /// The name.
        key: String,
        /// The client's flags, returned with the value.
        flags: u32,
        /// The value.
        data: Vec<u8>,
        /// No reply is wanted.
        noreply: bool,
    },
    /// `get KEY...`.
    Get(Vec<String>),
    /// `delete KEY [noreply]`.
    Delete {
        /// The name.
        key: String,
        /// No reply is wanted.
        noreply: bool,
    },
    /// `quit`: the client is done.
    Quit,
}

impl Command {
    /// Reads the command at the start of `buf`.
    ///
    /// # Errors
    /// A [`WireError`] when the bytes are not a command of this subset.
    pub fn parse(buf: &[u8]) -> Result<Parsed<Command>, WireError> {
        let (text, used) = match line(buf)? {
            Parsed::Incomplete => return Ok(Parsed::Incomplete),
            Parsed::Done(t, u) => (t, u),
        };
        let words: Vec<&str> = text.split_ascii_whitespace().collect();
        let key = |k: &str| check_key(k).map(|()| k.to_string());
        let command = match words[..] {
            ["set", k, flags, exptime, bytes] | ["set", k, flags, exptime, bytes, "noreply"] => {
                let key = key(k)?;
                let flags = number("the flags", flags)?;
                number::<i64>("the expiry", exptime)?;
                let len = value_len(bytes)?;
                return Ok(match data(&buf[used..], len)? {
                    Parsed::Incomplete => Parsed::Incomplete,
                    Parsed::Done(data, n) => Parsed::Done(
                        Command::Set {
                            key,
                            flags,
                            data,
                            noreply: words.len() == 6,
                        },
                        used + n,
                    ),
                });
            }
            ["get", ref keys @ ..] if keys.len() > MAX_VALUES => {
                return Err(WireError::TooManyValues)
            }
            ["get", ref keys @ ..] if !keys.is_empty() => {
                Command::Get(keys.iter().map(|k| key(k)).collect::<Result<_, _>>()?)
            }
            ["delete", k] | ["delete", k, "noreply"] => Command::Delete {
                key: key(k)?,
                noreply: words.len() == 3,
            },
            ["quit"] => Command::Quit,
            _ => return Err(unexpected(text)),
        };
        Ok(Parsed::Done(command, used))
    }

    /// The command's bytes on the wire.
    pub fn encode(&self) -> Vec<u8> {
        let noreply = |n: bool| if n { " noreply" } else { "" };
        match self {
            Command::Set {
                key,
                flags,
                data,
                noreply: n,
            } => {
                let mut out =
                    format!("set {key} {flags} 0 {}{}\r\n", data.len(), noreply(*n)).into_bytes();
                out.extend_from_slice(data);
                out.extend_from_slice(b"\r\n");
                out
            }
            Command::Get(keys) => format!("get {}\r\n", keys.join(" ")).into_bytes(),
            Command::Delete { key, noreply: n } => {
                format!("delete {key}{}\r\n", noreply(*n)).into_bytes()
            }
            Command::Quit => b"quit\r\n".to_vec(),
        }
    }
}

/// A reply, as the registry's client reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `STORED`.
    Stored,
    /// `NOT_STORED`.
    NotStored,
    /// `DELETED`.
    Deleted,
    /// `NOT_FOUND`.
    NotFound,
    /// A `get`'s answer: `VALUE KEY FLAGS BYTES` lines with their data,
    /// then `END`, as (name, flags, value).
    Values(Vec<(String, u32, Vec<u8>)>),
    /// `ERROR`, `CLIENT_ERROR ...` or `SERVER_ERROR ...`: the whole line.
    Error(String),
}

impl Reply {
    /// Reads the reply at the start of `buf`.
    ///
    /// # Errors
    /// A [`WireError`] when the bytes are not a reply of this subset.
    pub fn parse(buf: &[u8]) -> Result<Parsed<Reply>, WireError> {
        let mut used = 0;
        let mut values = Vec::new();
        loop {
            let (text, n) = match line(&buf[used..])? {
                Parsed::Incomplete => return Ok(Parsed::Incomplete),
                Parsed::Done(t, n) => (t, n),
            };
            let words: Vec<&str> = text.split_ascii_whitespace().collect();
            let simple = match words[..] {
                ["VALUE", k, flags, bytes] | ["VALUE", k, flags, bytes, _] => {
                    check_key(k)?;
                    let flags = number("the flags", flags)?;
                    let len = value_len(bytes)?;
                    match data(&buf[used + n..], len)? {
                        Parsed::Incomplete => return Ok(Parsed::Incomplete),
                        Parsed::Done(data, m) => {
                            values.push((k.to_string(), flags, data));
                            used += n + m;
                            if values.len() > MAX_VALUES {
                                return Err(WireError::TooManyValues);
                            }
                            continue;
                        }
                    }
                }
                ["END"] => Reply::Values(std::mem::take(&mut values)),
                _ if !values.is_empty() => return Err(unexpected(text)),
                ["STORED"] => Reply::Stored,
                ["NOT_STORED"] => Reply::NotStored,
                ["DELETED"] => Reply::Deleted,
                ["NOT_FOUND"] => Reply::NotFound,
                ["ERROR"] | ["CLIENT_ERROR", ..] | ["SERVER_ERROR", ..] => {
                    Reply::Error(text.to_string())
                }
                _ => return Err(unexpected(text)),
            };
            return Ok(Parsed::Done(simple, used + n));
        }
    }

    /// The reply's bytes on the wire.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Reply::Stored => b"STORED\r\n".to_vec(),
            Reply::NotStored => b"NOT_STORED\r\n".to_vec(),
            Reply::Deleted => b"DELETED\r\n".to_vec(),
            Reply::NotFound => b"NOT_FOUND\r\n".to_vec(),
            Reply::Values(values) => {
                let mut out = Vec::new();
                for (key, flags, data) in values {
                    let mut head = String::new();
                    let _ = write!(head, "VALUE {key} {flags} {}\r\n", data.len());
                    out.extend_from_slice(head.as_bytes());
                    out.extend_from_slice(data);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"END\r\n");
                out
            }
            Reply::Error(line) => format!("{line}\r\n").into_bytes(),
        }
    }

    /// The value of `key` in a `get`'s reply to that one name: `None`
    /// when it is not there.
    ///
    /// # Errors
    /// [`WireError::OtherKey`] if the reply carries another name, and
    /// [`WireError::Unexpected`] if it is not a `get`'s reply.
    pub fn value_of(self, key: &str) -> Result<Option<Vec<u8>>, WireError> {
        let Reply::Values(values) = self else {
            return Err(unexpected(&format!("{self:?}")));
        };
        let mut found = None;
        for (got, _, data) in values {
            if got != key || found.is_some() {
                return Err(WireError::OtherKey {
                    asked: key.to_string(),
                    got,
                });
            }
            found = Some(data);
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done<T>(p: Parsed<T>) -> (T, usize) {
        match p {
            Parsed::Done(t, n) => (t, n),
            Parsed::Incomplete => panic!("incomplete"),
        }
    }

    #[test]
    fn a_get_reply_is_read_whole_or_not_at_all() {
        let wire = b"VALUE srv-0 0 5\r\nhello\r\nEND\r\nSTORED\r\n";
        for end in 0..29 {
            assert_eq!(Reply::parse(&wire[..end]), Ok(Parsed::Incomplete), "{end}");
        }
        let (reply, used) = done(Reply::parse(wire).unwrap());
        assert_eq!(used, 29);
        assert_eq!(reply.value_of("srv-0").unwrap(), Some(b"hello".to_vec()));
        assert_eq!(
            done(Reply::parse(b"END\r\n").unwrap())
                .0
                .value_of("x")
                .unwrap(),
            None
        );
    }

    #[test]
    fn a_value_with_line_breaks_inside_is_data_not_lines() {
        let value = b"a\r\nEND\r\nb".to_vec();
        let reply = Reply::Values(vec![("k".into(), 7, value.clone())]);
        let (back, used) = done(Reply::parse(&reply.encode()).unwrap());
        assert_eq!(used, reply.encode().len());
        assert_eq!(back, reply);
        assert_eq!(back.value_of("k").unwrap(), Some(value));
    }

    #[test]
    fn replies_that_break_the_protocol_are_errors() {
        let other = Reply::parse(b"VALUE other 0 1\r\nx\r\nEND\r\n").unwrap();
        assert!(matches!(
            done(other).0.value_of("mine"),
            Err(WireError::OtherKey { .. })
        ));
        assert_eq!(
            Reply::parse(b"VALUE k 0 1\r\nxy\r\nEND\r\n"),
            Err(WireError::BadDataEnd)
        );
        assert_eq!(
            Reply::parse(b"VALUE k 0 99999999999\r\n"),
            Err(WireError::ValueTooLarge(99_999_999_999))
        );
        assert!(matches!(
            Reply::parse(b"VALUE k 0 1\r\nx\r\nSTORED\r\n"),
            Err(WireError::Unexpected(_))
        ));
        assert!(matches!(
            Reply::parse(b"HELLO\r\n"),
            Err(WireError::Unexpected(_))
        ));
        assert_eq!(
            Reply::parse(&[b'x'; MAX_LINE + 1]),
            Err(WireError::LineTooLong)
        );
        assert_eq!(Reply::parse(b"ST\xffRED\r\n"), Err(WireError::NotText));
        let (err, _) = done(Reply::parse(b"SERVER_ERROR out of memory\r\n").unwrap());
        assert_eq!(err, Reply::Error("SERVER_ERROR out of memory".into()));
    }

    #[test]
    fn a_line_of_the_longest_length_reads_back_after_encoding_with_either_end() {
        // A reply line of MAX_LINE bytes read with a bare `\n` is encoded
        // with `\r\n`; it must read back, and one byte more must not.
        let text = format!("SERVER_ERROR {}", "x".repeat(MAX_LINE - 13));
        for end in ["\n", "\r\n"] {
            let wire = format!("{text}{end}");
            let (reply, used) = done(Reply::parse(wire.as_bytes()).unwrap());
            assert_eq!((&reply, used), (&Reply::Error(text.clone()), wire.len()));
            let again = reply.encode();
            assert_eq!(Reply::parse(&again), Ok(Parsed::Done(reply, again.len())));
            assert_eq!(
                Reply::parse(format!("{text}x{end}").as_bytes()),
                Err(WireError::LineTooLong)
            );
        }
        assert_eq!(
            Reply::parse(format!("{text}\r").as_bytes()),
            Ok(Parsed::Incomplete)
        );
        let keys: Vec<String> = (0..MAX_LINE / 32).map(|i| format!("{i:031}")).collect();
        let get = format!("get {}", keys.join(" "));
        let get = &get[..MAX_LINE];
        let (command, _) = done(Command::parse(format!("{get}\n").as_bytes()).unwrap());
        let again = command.encode();
        assert_eq!(
            Command::parse(&again),
            Ok(Parsed::Done(command, again.len()))
        );
    }

    #[test]
    fn commands_round_trip_and_bad_names_are_refused() {
        for c in [
            Command::Set {
                key: "rpc/server-0".into(),
                flags: 3,
                data: b"{\"qpn\":17}".to_vec(),
                noreply: false,
            },
            Command::Set {
                key: "k".into(),
                flags: 0,
                data: Vec::new(),
                noreply: true,
            },
            Command::Get(vec!["a".into(), "b".into()]),
            Command::Delete {
                key: "a".into(),
                noreply: false,
            },
            Command::Quit,
        ] {
            let wire = c.encode();
            assert_eq!(Command::parse(&wire), Ok(Parsed::Done(c, wire.len())));
            assert_eq!(
                Command::parse(&wire[..wire.len() - 1]),
                Ok(Parsed::Incomplete)
            );
        }
        assert!(matches!(
            Command::parse(b"get \x01x\r\n"),
            Err(WireError::BadKey(..))
        ));
        assert!(matches!(
            Command::parse(format!("get {}\r\n", "k".repeat(251)).as_bytes()),
            Err(WireError::BadKey(..))
        ));
        assert!(matches!(
            Command::parse(b"set k x 0 1\r\nx\r\n"),
            Err(WireError::BadNumber(..))
        ));
        assert!(matches!(
            Command::parse(b"flush_all\r\n"),
            Err(WireError::Unexpected(_))
        ));
        assert!(check_key("a b").is_err() && check_key("").is_err() && check_key("ok").is_ok());
    }
}
