//! `parsim doctor`'s report (placeholder until the report lands).
