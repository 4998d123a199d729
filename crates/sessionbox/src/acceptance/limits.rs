//! The limit rows of `verify --acceptance`: CPU, disk, PIDs and memory, each tried past its
//! configured value by a bounded margin, and only where the runtime claims the limit.

use std::time::Duration;

use sessionbox_core::Session;

use super::probes::{self, Verdict};
use super::{Row, answers, sh, text};

/// The row of a limit the runtime does not claim: not probed (the probe would load the
/// machine with nothing to stop it).
fn unclaimed(name: &'static str, control: &'static str) -> Row {
    Row {
        name,
        control,
        verdict: Verdict::NotEnforced,
        claimed: false,
        detail: "no such limit is configured for this runtime; not probed (nothing would bound the probe)".into(),
    }
}

pub(super) async fn cpu(s: &dyn Session, limit: Option<f64>) -> anyhow::Result<Row> {
    const CONTROL: &str = "CPU use held to the configured CPUs (measured with busy loops)";
    let Some(limit) = limit else {
        return Ok(unclaimed("cpu", CONTROL));
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let loops = (limit.ceil() + 1.0).min(cores);
    if loops <= limit {
        return Ok(Row {
            name: "cpu",
            control: CONTROL,
            verdict: Verdict::NotMeasured,
            claimed: true,
            detail: format!("limit {limit} CPUs is not below this host's {cores} cores"),
        });
    }
    let r = sh(s, &probes::cpu_script(loops as u32), 30, 64 << 10).await?;
    let (used, max) = probes::parse_cpu(&text(&r.stdout));
    // CPU seconds over the two seconds the loops ran at least: an upper bound of the CPUs used.
    let used_cpus = used.map(|u| u / 2.0);
    let holds = used_cpus.is_some_and(|u| u <= limit * 1.15 + 0.1);
    // Loops held well below the limit were slowed by the host's own load: they show the limit
    // was not exceeded, not that it would have stopped them.
    let busy = used_cpus.is_some_and(|u| u < limit * 0.8);
    Ok(Row {
        name: "cpu",
        control: CONTROL,
        verdict: Verdict::of(holds, true),
        claimed: true,
        detail: format!(
            "{loops} busy loops for 2 s used {} CPUs (limit {limit}){}; cgroup cpu.max {}",
            used_cpus.map_or("an unreadable number of".to_owned(), |u| format!("{u:.2}")),
            if busy {
                " (below the limit: the host was busy, so this shows only that it was not exceeded)"
            } else {
                ""
            },
            max.as_deref().unwrap_or("not readable")
        ),
    })
}

pub(super) async fn disk(s: &dyn Session, limit: Option<u64>, run_id: &str) -> anyhow::Result<Row> {
    const CONTROL: &str = "writes past the workspace's disk quota are refused";
    let Some(limit) = limit else {
        return Ok(unclaimed("disk", CONTROL));
    };
    let chunks = limit / probes::DISK_CHUNK + 2;
    let r = sh(s, &probes::disk_script(run_id, chunks), 300, 64 << 10).await?;
    let (refused, full) = probes::parse_disk(&text(&r.stdout), &text(&r.stderr));
    let cleaned = text(&r.stdout).contains("cleaned");
    let alive = answers(s).await;
    let within = refused.is_some_and(|n| n * probes::DISK_CHUNK <= limit);
    Ok(Row {
        name: "disk",
        control: CONTROL,
        verdict: Verdict::of(within && full && alive && cleaned, true),
        claimed: true,
        detail: format!(
            "limit {} MiB; {}; the sandbox {}",
            limit >> 20,
            match refused {
                Some(n) => format!(
                    "refused after {} MiB ({})",
                    (n * probes::DISK_CHUNK) >> 20,
                    if full {
                        "no space / quota exceeded"
                    } else {
                        "another error"
                    }
                ),
                None => format!(
                    "{} MiB written, none refused",
                    (chunks * probes::DISK_CHUNK) >> 20
                ),
            },
            if alive {
                "still answers"
            } else {
                "no longer answers"
            }
        ),
    })
}

pub(super) async fn pids(s: &dyn Session, limit: Option<u64>) -> anyhow::Result<Row> {
    const CONTROL: &str = "processes held to the configured number (a bounded fork bomb)";
    let Some(limit) = limit else {
        return Ok(unclaimed("pids", CONTROL));
    };
    let tried = limit + 32;
    let r = sh(s, &probes::pids_script(tried), 60, 1 << 20).await;
    let (most, all) = match &r {
        Ok(r) => probes::parse_pids(&text(&r.stdout)),
        Err(_) => (0, false),
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let alive = answers(s).await;
    Ok(Row {
        name: "pids",
        control: CONTROL,
        verdict: Verdict::of(!all && most <= limit && alive && r.is_ok(), true),
        claimed: true,
        detail: format!(
            "limit {limit}; tried {tried}, {most} started{}; the sandbox {}",
            match &r {
                Err(e) => format!(" (exec: {e})"),
                Ok(_) => String::new(),
            },
            if alive {
                "still answers"
            } else {
                "no longer answers"
            }
        ),
    })
}

pub(super) async fn memory(s: &dyn Session, limit: Option<u64>) -> anyhow::Result<Row> {
    const CONTROL: &str = "memory held to the configured bytes (an allocation past it is killed)";
    let Some(limit) = limit else {
        return Ok(unclaimed("memory", CONTROL));
    };
    let tried = limit + limit / 4 + (16 << 20);
    let r = sh(s, &probes::memory_script(tried), 120, 4096).await;
    let survived = match &r {
        Ok(r) => text(&r.stdout).contains(&format!("survived {tried}")),
        Err(_) => false,
    };
    let how = match &r {
        Ok(r) if survived => "it was held in full".to_owned(),
        Ok(r) => format!("it ended with {}", r.shell_exit_code()),
        Err(e) => format!("the command failed: {e}"),
    };
    let alive = answers(s).await;
    Ok(Row {
        name: "memory",
        control: CONTROL,
        verdict: Verdict::of(!survived && alive, true),
        claimed: true,
        detail: format!(
            "limit {} MiB; held {} MiB in a shell variable: {how}; the sandbox {}",
            limit >> 20,
            tried >> 20,
            if alive {
                "still answers"
            } else {
                "no longer answers"
            }
        ),
    })
}
