//! The execd command event stream (`sessionbox_execd::EventStreamParser`): the body of
//! `POST /command` as a sandbox's agent (or a real OpenSandbox execd, or anything between)
//! sends it, in chunks cut wherever the network cuts them.
//!
//! Input: a header byte `h` (`h & 7` split points follow as 2 bytes each; `h & 8`: a small
//! event limit instead of the default), then the body.
//! Properties:
//! - chunking does not change the result: the body pushed whole, cut at the fuzz-chosen
//!   points, and (for short bodies) byte by byte, gives the same events or the same error;
//! - a stream that parses ends with exactly one terminal event, the last, and nothing after it
//!   is read.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sessionbox_execd::{EventStreamParser, ServerStreamEvent, StreamError};

fn parser(small: bool) -> EventStreamParser {
    if small {
        EventStreamParser::with_max_event_bytes(256)
    } else {
        EventStreamParser::new()
    }
}

fn parse_chunks<'a>(
    small: bool,
    chunks: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Vec<ServerStreamEvent>, StreamError> {
    let mut p = parser(small);
    let mut events = Vec::new();
    for c in chunks {
        events.extend(p.push(c)?);
    }
    events.extend(p.finish()?);
    assert_eq!(p.events_seen(), events.len());
    Ok(events)
}

fuzz_target!(|data: &[u8]| {
    let Some((&h, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(h & 7);
    let small = h & 8 != 0;
    if rest.len() < 2 * n {
        return;
    }
    let (cuts, body) = rest.split_at(2 * n);
    let mut at: Vec<usize> = cuts
        .chunks(2)
        .map(|c| usize::from(u16::from_le_bytes([c[0], c[1]])) % (body.len() + 1))
        .collect();
    at.sort_unstable();
    let mut chunks = Vec::new();
    let mut from = 0;
    for cut in at {
        chunks.push(&body[from..cut]);
        from = cut;
    }
    chunks.push(&body[from..]);

    let whole = parse_chunks(small, [body]);
    let cut = parse_chunks(small, chunks.iter().copied());
    assert_eq!(
        whole,
        cut,
        "cut at {:?}",
        chunks.iter().map(|c| c.len()).collect::<Vec<_>>()
    );
    if body.len() <= 512 {
        let bytewise = parse_chunks(small, body.chunks(1));
        assert_eq!(whole, bytewise, "byte by byte");
    }
    if let Ok(events) = whole {
        let last = events
            .last()
            .expect("a parsed stream has its terminal event");
        assert!(last.is_terminal());
        assert!(events[..events.len() - 1].iter().all(|e| !e.is_terminal()));
    }
});
