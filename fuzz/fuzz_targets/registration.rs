//! The registration protocol's two messages from arbitrary bytes: the
//! greeting the coordinator reads (however the bytes arrive) and the
//! answer a registering process reads. An answer or an error, never a
//! panic; an answer read back from its own line is the same answer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mtrdma_core::coordinator::wire::{self, Answer, FirstLine, GREETING_MAX};

fuzz_target!(|data: &[u8]| {
    // The greeting, grown byte by byte as a slow client sends it: once it
    // is decided, more bytes do not change the decision.
    let mut decided: Option<FirstLine> = None;
    for end in 0..=data.len().min(GREETING_MAX + 8) {
        let g = wire::greeting(&data[..end]);
        match (&decided, &g) {
            (None, FirstLine::Incomplete) => {}
            (None, _) => decided = Some(g),
            (Some(d), _) => assert_eq!(d, &g, "a decided greeting changed with more bytes"),
        }
    }
    if let Some(FirstLine::Line(line)) = &decided {
        assert!(!line.contains('\n'));
        assert!(line.len() < GREETING_MAX);
    }

    // The answer.
    if let Ok(text) = std::str::from_utf8(data) {
        if let Some(answer) = Answer::parse(text) {
            let line = answer.to_line();
            let again = Answer::parse(line.trim_end_matches('\n'));
            match &answer {
                Answer::Registered(_) => assert_eq!(again.as_ref(), Some(&answer)),
                // A reason is put on one line.
                Answer::Refused(_) => assert!(matches!(again, Some(Answer::Refused(_)))),
            }
        }
    }
});
