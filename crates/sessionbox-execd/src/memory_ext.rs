//! sessionbox's memory extension of the execd API: `GET /sessionbox/v1/memory`.
//!
//! Upstream's `GET /metrics` reports `/proc/meminfo`, which in a container is the host's
//! memory, not the container's. A sessionbox agent also answers this route with the charge of
//! the cgroup it runs in (a container's own, as the kernel counts it against the container's
//! limit): 200 with a [`MemoryUsage`](sessionbox_core::MemoryUsage), or 200 with `null` when it
//! runs in no memory cgroup it can read (cgroup file system not mounted, as in an `isolated`
//! sandbox, whose host reads its cgroups itself).

/// The route.
pub const MEMORY_PATH: &str = "/sessionbox/v1/memory";
