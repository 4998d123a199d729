//! `verify`'s fork check: snapshots and forks keep conversations apart as the rest of the
//! experiment does.

use std::time::Instant;

use sessionbox_core::{ConversationId, ConversationRef, TenantId};

use super::{Check, Run};

/// The fork check on `origin`: a file written before a snapshot is what a conversation forked
/// from the snapshot sees, not the origin's later write; a live fork sees the origin as it is
/// at the fork; after that, a write in either is never seen in the other. The forks are added
/// to `created` (cleanup destroys them) and the snapshot is deleted.
pub(super) async fn fork_check(
    run: &Run<'_>,
    tenant: &TenantId,
    origin: &ConversationRef,
    id: &str,
    check: &mut Check,
    created: &mut Vec<ConversationRef>,
) -> anyhow::Result<()> {
    let target = run.target;
    let path = "verify-fork/state.txt";
    let snapshot = format!("verify-{id}");
    let named = |tail: &str| -> anyhow::Result<ConversationRef> {
        Ok(ConversationRef::new(
            tenant.clone(),
            ConversationId::new(format!("verify-{id}-{tail}"))?,
        ))
    };
    let (from_snapshot, live) = (named("fork-s")?, named("fork-l")?);

    let o = run.open(origin).await?.session;
    run.write(&*o, path, "before the snapshot").await?;
    run.close(o).await?;
    let t = Instant::now();
    target.snapshot(origin, &snapshot).await?;
    run.timings.add("snapshot", t);
    let o = run.open(origin).await?.session;
    run.write(&*o, path, "after the snapshot").await?;
    run.close(o).await?;

    created.push(from_snapshot.clone());
    let t = Instant::now();
    let forked = target.fork_snapshot(&snapshot, &from_snapshot).await;
    run.timings.add("fork", t);
    let deleted = target.delete_snapshot(tenant, &snapshot).await;
    forked?;
    deleted?;
    created.push(live.clone());
    let t = Instant::now();
    target.fork_live(origin, &live).await?;
    run.timings.add("fork", t);

    let f = run.open(&from_snapshot).await?.session;
    let seen = run.read(&*f, path).await?;
    check.expect(seen == "before the snapshot", || {
        format!("the fork of the snapshot reads {seen:?}, not the file as of the snapshot")
    });
    run.write(&*f, path, "written in the fork").await?;
    let l = run.open(&live).await?.session;
    let seen = run.read(&*l, path).await?;
    check.expect(seen == "after the snapshot", || {
        format!("the live fork reads {seen:?}, not the origin as it was at the fork")
    });
    let o = run.open(origin).await?.session;
    run.write(&*o, path, "written in the origin after the forks")
        .await?;
    let seen = run.read(&*o, path).await?;
    check.expect(seen == "written in the origin after the forks", || {
        format!("the origin reads {seen:?}: a fork's write reached it")
    });
    for (name, s) in [("the fork of the snapshot", &f), ("the live fork", &l)] {
        let seen = run.read(&**s, path).await?;
        check.expect(seen != "written in the origin after the forks", || {
            format!("{name} sees the origin's write made after the fork")
        });
    }
    let seen = run.read(&*l, path).await?;
    check.expect(seen == "after the snapshot", || {
        format!("the live fork reads {seen:?}: another conversation's write reached it")
    });
    run.close(o).await?;
    run.close(f).await?;
    run.close(l).await?;
    Ok(())
}
