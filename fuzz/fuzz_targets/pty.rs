//! Terminal frames (`sessionbox_execd::pty`): the WebSocket frames of a terminal, which the
//! agent reads from the client (JSON control frames: `resize`, `signal`, `ping`, `stdin`) and
//! `sessionbox shell` reads from the agent (binary output and replay frames, JSON `connected`,
//! `exit`, `error` frames). The WebSocket framing itself is tungstenite's.
//!
//! Input: a mode byte, then a frame.
//! Properties:
//! - a binary frame taken apart puts back together to the same bytes; only an empty frame or
//!   a replay frame shorter than its 9-byte header is refused;
//! - a JSON frame that parses, written again, parses to the same frame;
//! - a `resize` frame has a window size exactly when both sizes are 1 to 65535, and that size
//!   is the frame's (the agent ignores every other `resize`); a frame made by
//!   `ClientFrame::resize` has its own size.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sessionbox_execd::pty::{
    ClientFrame, ServerFrame, binary_frame, channel, parse_server_binary, replay_frame,
};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, frame)) = data.split_first() else {
        return;
    };
    match parse_server_binary(frame) {
        Some((ch, Some(offset), rest)) => {
            assert_eq!(ch, channel::REPLAY);
            assert_eq!(replay_frame(offset, rest), frame);
        }
        Some((ch, None, rest)) => {
            assert_ne!(ch, channel::REPLAY);
            assert_eq!(binary_frame(ch, rest), frame);
        }
        None => assert!(frame.is_empty() || (frame[0] == channel::REPLAY && frame.len() < 9)),
    }
    if frame.len() >= 4 && mode & 1 == 1 {
        let cols = u16::from_le_bytes([frame[0], frame[1]]);
        let rows = u16::from_le_bytes([frame[2], frame[3]]);
        let text = serde_json::to_string(&ClientFrame::resize(cols, rows)).expect("serialise");
        let back: ClientFrame = serde_json::from_str(&text).expect("parse");
        let want = (cols > 0 && rows > 0).then_some((cols, rows));
        assert_eq!(back.window_size(), want, "{text}");
    }
    let Ok(text) = std::str::from_utf8(frame) else {
        return;
    };
    if let Ok(c) = serde_json::from_str::<ClientFrame>(text) {
        let again = serde_json::to_string(&c).expect("serialise");
        assert_eq!(
            serde_json::from_str::<ClientFrame>(&again).expect("parse again"),
            c
        );
        let fits = |n: u32| (1..=u32::from(u16::MAX)).contains(&n);
        match c.window_size() {
            Some((cols, rows)) => {
                assert_eq!(c.kind, "resize");
                assert_eq!((u32::from(cols), u32::from(rows)), (c.cols, c.rows));
            }
            None => assert!(
                c.kind != "resize" || !fits(c.cols) || !fits(c.rows),
                "{c:?}"
            ),
        }
    }
    if let Ok(s) = serde_json::from_str::<ServerFrame>(text) {
        let again = serde_json::to_string(&s).expect("serialise");
        assert_eq!(
            serde_json::from_str::<ServerFrame>(&again).expect("parse again"),
            s
        );
    }
});
