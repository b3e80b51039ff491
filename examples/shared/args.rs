//! The examples' command lines, read with `lexopt`: flags as `-s 4096`,
//! `-s4096`, `--size 4096` or `--size=4096`, and plain values. Each example
//! matches the flags as written (`-s`, `--size`) and keeps its own checks.

// Each example uses a part of it. Its items are `pub` for mtrdma-demo's
// library, which includes it too; in an example they are the crate's own.
#![allow(dead_code, unreachable_pub)]

use std::fmt::Display;
use std::str::FromStr;

/// One item of the command line.
#[derive(Debug)]
pub enum Token {
    /// A flag as written: `-s` or `--size`.
    Flag(String),
    /// A plain value (not a flag's).
    Value(String),
}

/// The command line, item by item.
#[derive(Debug)]
pub struct Args(lexopt::Parser);

impl Args {
    /// This process's arguments.
    pub fn from_env() -> Args {
        Args(lexopt::Parser::from_env())
    }

    /// `args`, without the program's name.
    pub fn from_args(args: impl IntoIterator<Item = String>) -> Args {
        Args(lexopt::Parser::from_args(args))
    }

    /// The next flag or plain value, if any.
    // Not an iterator: reading an item can fail, and values are read
    // between items.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Token>, String> {
        Ok(match self.0.next().map_err(|e| e.to_string())? {
            None => None,
            Some(lexopt::Arg::Short(c)) => Some(Token::Flag(format!("-{c}"))),
            Some(lexopt::Arg::Long(l)) => Some(Token::Flag(format!("--{l}"))),
            Some(lexopt::Arg::Value(v)) => {
                Some(Token::Value(v.into_string().map_err(|v| {
                    format!("{} is not UTF-8", v.to_string_lossy())
                })?))
            }
        })
    }

    /// The next flag, if any; a plain value is an error, `unexpected(value)`.
    pub fn next_flag(
        &mut self,
        unexpected: impl FnOnce(String) -> String,
    ) -> Result<Option<String>, String> {
        match self.next()? {
            Some(Token::Flag(flag)) => Ok(Some(flag)),
            Some(Token::Value(v)) => Err(unexpected(v)),
            None => Ok(None),
        }
    }

    /// The value given to `flag`.
    pub fn value(&mut self, flag: &str) -> Result<String, String> {
        let v = self
            .0
            .value()
            .map_err(|_| format!("{flag} needs a value (see --help)"))?;
        v.into_string()
            .map_err(|v| format!("{flag} {}: not UTF-8", v.to_string_lossy()))
    }

    /// The value given to `flag`, parsed.
    pub fn parse<T: FromStr>(&mut self, flag: &str) -> Result<T, String>
    where
        T::Err: Display,
    {
        let v = self.value(flag)?;
        v.parse().map_err(|e| format!("{flag} {v}: {e}"))
    }
}
