//! The snapshot slots of one process, shared fairly between tenants.
//!
//! A snapshot operation (take, restore, fork, template start, import) holds a slot for its
//! length: the slots bound the scratch disk such operations take at once. They are the
//! process's, not a tenant's, so without a share one tenant running as many operations as there
//! are slots (four snapshots of full workspaces in a loop) kept every other tenant's operations
//! refused as busy, and with them the creation of every conversation that starts from a
//! default template. A tenant may hold at most half of the slots: the other half is always
//! left to the others.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sessionbox_core::{Error, Result, TenantId};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The process's slots and how many each tenant holds.
pub(crate) struct SnapshotSlots {
    all: Arc<Semaphore>,
    per_tenant: usize,
    held: Arc<Mutex<HashMap<TenantId, usize>>>,
}

/// One slot, held by a tenant until dropped.
pub(crate) struct SnapshotSlot {
    _permit: OwnedSemaphorePermit,
    tenant: TenantId,
    held: Arc<Mutex<HashMap<TenantId, usize>>>,
}

impl SnapshotSlots {
    /// `slots` in all (at least 2), at most half of them (rounded down) held by one tenant.
    pub(crate) fn new(slots: usize) -> SnapshotSlots {
        let slots = slots.max(2);
        SnapshotSlots {
            all: Arc::new(Semaphore::new(slots)),
            per_tenant: slots / 2,
            held: Arc::default(),
        }
    }

    /// A slot for an operation of `tenant`, never waited for (an operation may hold a
    /// conversation, and waiting while holding one could wait forever).
    ///
    /// # Errors
    /// [`Error::Busy`] when `tenant` holds its share already, or every slot is taken.
    pub(crate) fn take(&self, tenant: &TenantId) -> Result<SnapshotSlot> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let mine = held.get(tenant).copied().unwrap_or(0);
        if mine >= self.per_tenant {
            return Err(Error::Busy(format!(
                "this tenant runs {mine} snapshot operations already (snapshots, restores, forks, \
                 template starts and imports), the most one tenant may run at once in this \
                 process; retry when one has ended"
            )));
        }
        let permit = self.all.clone().try_acquire_owned().map_err(|_| {
            Error::Busy(
                "every snapshot slot of this process is in use (snapshots, restores, forks, \
                 template starts and imports run a few at a time); retry shortly"
                    .into(),
            )
        })?;
        held.insert(tenant.clone(), mine + 1);
        Ok(SnapshotSlot {
            _permit: permit,
            tenant: tenant.clone(),
            held: self.held.clone(),
        })
    }
}

impl Drop for SnapshotSlot {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = held.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attack: tenant A runs as many snapshot operations as it may, in a loop. It gets
    /// half of the slots, never more; tenant B still gets the other half, and A's share comes
    /// back as its operations end.
    #[test]
    fn one_tenant_holds_at_most_half_of_the_slots_and_another_gets_the_rest() {
        let slots = SnapshotSlots::new(4);
        let (a, b) = (TenantId::new("a").unwrap(), TenantId::new("b").unwrap());
        let a1 = slots.take(&a).unwrap();
        let _a2 = slots.take(&a).unwrap();
        let e = slots.take(&a).err().unwrap();
        assert!(
            matches!(&e, Error::Busy(m) if m.contains("this tenant")),
            "{e:?}"
        );
        let _b1 = slots.take(&b).unwrap();
        let _b2 = slots.take(&b).unwrap();
        assert!(matches!(slots.take(&b), Err(Error::Busy(_))));
        drop(a1);
        let _a3 = slots.take(&a).unwrap();
        assert_eq!(slots.held.lock().unwrap().values().sum::<usize>(), 4);
    }
}
