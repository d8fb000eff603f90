//! The one integration-test binary: drives the real `dlock` against real lock servers.

mod acquire;
mod bench;
mod cli;
mod conformance;
mod etcd;
mod etcd_hostile;
mod faults;
mod file;
mod generated;
mod hostile;
mod interop;
mod modes;
mod mysql;
mod partition;
mod pg_fake;
mod postgres;
mod recipes;
mod redis;
mod redis_cluster;
mod redis_sentinel;
mod redlock;
mod servers;
mod sql_safety;
mod tree;
mod util;
mod zookeeper;
