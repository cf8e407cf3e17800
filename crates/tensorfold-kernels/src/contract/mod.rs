//! The kernel contract (filled in below).
