//! The client's tests: the protocol vectors, the lease clock, a fake server for the failure paths
//! a real single node cannot easily produce, and the real server.

mod clock;
mod driver;
mod edges;
mod fake;
mod server;
mod support;
mod vectors;
