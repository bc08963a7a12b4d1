//! The process tier jail.
