//! Verdicts aggregated before they are written: a flood of one verdict becomes one row with a
//! count, and each conversation gets at most a fixed number of rows per window.
//!
//! [`Aggregator::add`] takes a verdict (from [`Control::record`](crate::Control::record); it
//! never blocks on I/O) and adds it to the current window of its conversation, grouped by
//! `(allowed, method, target, address, rule, end)`: a group is one row, its `count` the number
//! of verdicts, its bytes their sums, its duration the longest, its time the first one's. A
//! conversation with more groups in one window than [`AggregatorConfig::max_rows`] gets the
//! rest folded into one row per verdict kind (allowed, denied) whose target is `*` and whose
//! rule says so ([`OVERFLOW_RULE`]): every verdict is counted, none is itemized past the cap,
//! and the memory held is bounded by the cap too.
//!
//! The writer task hands a window to the sink (on a blocking thread, one call per window) as
//! soon as the previous hand-over is at least [`AggregatorConfig::window`] old: the first verdict
//! after a quiet spell is written at once, a flood once per window. So a flood of N verdicts
//! from one conversation costs about `seconds × (max_rows + 2)` rows, not N.
//! [`Aggregator::close`] writes what is left (call it when the gateway stops).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::gateway::LogEntry;

/// The rule of a row that stands for the verdicts past a conversation's cap in one window.
pub const OVERFLOW_RULE: &str =
    "more distinct verdicts in one second than the log keeps (log_rows_per_sec): not itemized";

/// How verdicts are aggregated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AggregatorConfig {
    /// The shortest time between two hand-overs to the sink.
    pub window: Duration,
    /// Most itemized rows per conversation per window (at least 1); the rest is counted in
    /// at most two more (allowed, denied).
    pub max_rows: usize,
}

impl AggregatorConfig {
    /// Itemized rows per conversation per second by default (`[egress] log_rows_per_sec`).
    pub const DEFAULT_MAX_ROWS: usize = 20;
}

impl Default for AggregatorConfig {
    fn default() -> Self {
        AggregatorConfig {
            window: Duration::from_secs(1),
            max_rows: Self::DEFAULT_MAX_ROWS,
        }
    }
}

/// One row to write: a verdict and how many identical ones it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerdictRow {
    /// The verdict (bytes summed, duration the longest, over `count` verdicts).
    pub entry: LogEntry,
    /// How many verdicts (at least 1).
    pub count: u64,
    /// When the first of them was decided.
    pub first: SystemTime,
}

/// Where rows go: called on a blocking thread with one window's rows.
pub type Sink = Arc<dyn Fn(Vec<VerdictRow>) + Send + Sync>;

type Key = (bool, String, String, Option<String>, String, Option<String>);

fn key(e: &LogEntry) -> Key {
    (
        e.allowed,
        e.method.clone(),
        e.target.clone(),
        e.address.clone(),
        e.rule.clone(),
        e.end.clone(),
    )
}

#[derive(Default)]
struct Window {
    groups: HashMap<Key, usize>,
    rows: Vec<VerdictRow>,
    /// Past the cap: index 0 denied, 1 allowed.
    overflow: [Option<VerdictRow>; 2],
}

fn merge(row: &mut VerdictRow, e: &LogEntry) {
    row.count += 1;
    row.entry.bytes_up = row.entry.bytes_up.saturating_add(e.bytes_up);
    row.entry.bytes_down = row.entry.bytes_down.saturating_add(e.bytes_down);
    row.entry.duration_ms = row.entry.duration_ms.max(e.duration_ms);
}

#[derive(Default)]
struct State {
    windows: HashMap<String, Window>,
    verdicts: u64,
}

struct Inner {
    config: AggregatorConfig,
    state: Mutex<State>,
    wake: tokio::sync::Notify,
    /// Held while a window is handed to the sink, so that [`Aggregator::close`] waits for it.
    writing: tokio::sync::Mutex<Option<Instant>>,
    sink: Sink,
}

/// The aggregator. Cheap to clone (one writer task is shared).
#[derive(Clone)]
pub struct Aggregator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Aggregator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Aggregator")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl Aggregator {
    /// An aggregator handing windows to `sink`; starts its writer task on the current Tokio
    /// runtime (panics outside one).
    pub fn start(config: AggregatorConfig, sink: Sink) -> Aggregator {
        let config = AggregatorConfig {
            max_rows: config.max_rows.max(1),
            ..config
        };
        let inner = Arc::new(Inner {
            config,
            state: Mutex::new(State::default()),
            wake: tokio::sync::Notify::new(),
            writing: tokio::sync::Mutex::new(None),
            sink,
        });
        let task = inner.clone();
        tokio::spawn(async move {
            loop {
                task.wake.notified().await;
                let last = *task.writing.lock().await;
                if let Some(wait) = last.and_then(|t| task.config.window.checked_sub(t.elapsed())) {
                    tokio::time::sleep(wait).await;
                }
                flush(&task).await;
            }
        });
        Aggregator { inner }
    }

    /// Adds one verdict to its conversation's window. Never blocks on I/O.
    pub fn add(&self, e: LogEntry) {
        let Ok(mut state) = self.inner.state.lock() else {
            return;
        };
        state.verdicts += 1;
        let max_rows = self.inner.config.max_rows;
        let w = state.windows.entry(e.conversation.clone()).or_default();
        let k = key(&e);
        if let Some(&i) = w.groups.get(&k) {
            merge(&mut w.rows[i], &e);
        } else if w.rows.len() < max_rows {
            w.groups.insert(k, w.rows.len());
            w.rows.push(VerdictRow {
                entry: e,
                count: 1,
                first: SystemTime::now(),
            });
        } else {
            let slot = &mut w.overflow[usize::from(e.allowed)];
            if let Some(row) = slot.as_mut() {
                merge(row, &e);
            } else {
                *slot = Some(VerdictRow {
                    entry: LogEntry {
                        method: "*".into(),
                        target: "*".into(),
                        address: None,
                        rule: OVERFLOW_RULE.into(),
                        end: None,
                        ..e
                    },
                    count: 1,
                    first: SystemTime::now(),
                });
            }
        }
        drop(state);
        self.inner.wake.notify_one();
    }

    /// How many verdicts were added since the start.
    pub fn verdicts(&self) -> u64 {
        self.inner.state.lock().map_or(0, |s| s.verdicts)
    }

    /// Hands what is pending to the sink now, and waits until it is written (including a
    /// hand-over under way). Call it when the gateway stops; verdicts added later wait for the
    /// next window as usual.
    pub async fn close(&self) {
        flush(&self.inner).await;
    }
}

/// Takes every window and hands its rows to the sink, under the `writing` lock.
async fn flush(inner: &Arc<Inner>) {
    let mut writing = inner.writing.lock().await;
    let windows = match inner.state.lock() {
        Ok(mut s) => std::mem::take(&mut s.windows),
        Err(_) => return,
    };
    let rows: Vec<VerdictRow> = windows
        .into_values()
        .flat_map(|w| w.rows.into_iter().chain(w.overflow.into_iter().flatten()))
        .collect();
    if rows.is_empty() {
        return;
    }
    *writing = Some(Instant::now());
    let sink = inner.sink.clone();
    if let Err(e) = tokio::task::spawn_blocking(move || (*sink)(rows)).await {
        tracing::error!("the egress verdict writer failed: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied(conv: &str, target: &str) -> LogEntry {
        LogEntry {
            conversation: conv.into(),
            allowed: false,
            method: "CONNECT".into(),
            target: target.into(),
            address: None,
            rule: "no allow rule".into(),
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 1,
            end: None,
        }
    }

    fn collecting() -> (Sink, Arc<Mutex<Vec<Vec<VerdictRow>>>>) {
        let got = Arc::new(Mutex::new(Vec::new()));
        let g = got.clone();
        (
            Arc::new(move |rows: Vec<VerdictRow>| g.lock().unwrap().push(rows)),
            got,
        )
    }

    /// A flood of 10 000 refused CONNECTs to one target, and 10 000 to distinct targets, from
    /// one conversation within a window: a handful of rows, and the counts add up.
    #[tokio::test]
    async fn a_flood_becomes_a_few_rows_whose_counts_add_up() {
        let (sink, got) = collecting();
        let agg = Aggregator::start(
            AggregatorConfig {
                window: Duration::from_secs(3600),
                max_rows: 5,
            },
            sink,
        );
        // The first verdict is written at once (nothing was written before).
        agg.add(denied("a", "x:443"));
        for _ in 0..200 {
            if !got.lock().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(got.lock().unwrap().len(), 1, "the first verdict waits");
        for i in 0..10_000 {
            agg.add(denied("a", "x:443"));
            agg.add(denied("a", &format!("h{i}:443")));
            agg.add(denied("b", "y:443"));
        }
        // The window is an hour: nothing more is written until close.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(got.lock().unwrap().len(), 1);
        agg.close().await;
        let windows = got.lock().unwrap().clone();
        assert_eq!(windows.len(), 2);
        let rows = &windows[1];
        let of = |c: &'static str| rows.iter().filter(move |r| r.entry.conversation == c);
        // a: x:443 and four distinct targets itemized, the rest in one overflow row.
        assert_eq!(of("a").count(), 6, "{rows:?}");
        assert_eq!(of("a").map(|r| r.count).sum::<u64>(), 20_000);
        let over: Vec<_> = of("a").filter(|r| r.entry.rule == OVERFLOW_RULE).collect();
        assert_eq!((over.len(), over[0].count), (1, 10_000 - 4));
        assert_eq!(
            of("b")
                .map(|r| (r.count, r.entry.target.as_str()))
                .collect::<Vec<_>>(),
            [(10_000, "y:443")]
        );
        assert_eq!(agg.verdicts(), 30_001);
    }

    /// Rows of a flood are written once per window, not once per verdict.
    #[tokio::test]
    async fn a_flood_is_written_once_per_window() {
        let (sink, got) = collecting();
        let agg = Aggregator::start(
            AggregatorConfig {
                window: Duration::from_millis(200),
                max_rows: 20,
            },
            sink,
        );
        let started = Instant::now();
        let mut n = 0u64;
        while started.elapsed() < Duration::from_millis(1000) {
            agg.add(denied("a", "x:443"));
            n += 1;
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        agg.close().await;
        let windows = got.lock().unwrap().clone();
        assert!(windows.len() <= 8, "{} hand-overs", windows.len());
        let total: u64 = windows.iter().flatten().map(|r| r.count).sum();
        assert_eq!(total, n);
        assert!(windows.iter().all(|w| w.len() == 1));
    }
}
