//! Integration tests: the real proxy in front of a real upstream, driven by
//! real drivers. The upstream is SecantusDB, installed and started by
//! [`common::upstream`], or the server named by `LACONIC_TEST_UPSTREAM`.

mod common;

mod aggregate;
mod alerts;
mod capture;
mod cross_db;
mod deploy;
mod dictionary;
mod differential;
mod dns;
mod errors;
mod handshake;
mod hostile;
mod isolation;
mod migrate;
mod name_store;
mod observe;
mod passthrough;
mod pymongo;
mod schema;
mod settings;
mod shard_key;
mod shutdown;
mod threads;
mod tls;
mod tokenize;
mod topology;
