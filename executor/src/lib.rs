//! parsim-executor: plays a Plan (shard shapes, process groups, per-rank actions) on a backend.
//! The Plan types and backends arrive with the executor issues; this crate knows nothing of models.
