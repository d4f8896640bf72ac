//! A DNS server for the tests, on a loopback UDP port: it answers from
//! records the test sets and changes, so that `mongodb+srv://` resolution
//! is tested against a resolver the test controls, not the internet.

use std::net::SocketAddr;
use std::sync::Arc;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::{SRV, TXT};
use hickory_proto::rr::{Name, RData, Record};
use parking_lot::Mutex;
use tokio::net::UdpSocket;

pub struct Dns {
    pub addr: SocketAddr,
    records: Arc<Mutex<Vec<Record>>>,
}

impl Dns {
    pub async fn start() -> Dns {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let records: Arc<Mutex<Vec<Record>>> = Arc::default();
        let zone = records.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            while let Ok((n, from)) = socket.recv_from(&mut buf).await {
                let Ok(query) = Message::from_vec(&buf[..n]) else {
                    continue;
                };
                let mut reply = Message::response(query.metadata.id, query.metadata.op_code);
                reply.metadata.message_type = MessageType::Response;
                reply.metadata.authoritative = true;
                reply.metadata.recursion_desired = query.metadata.recursion_desired;
                reply.metadata.recursion_available = true;
                reply.edns = query.edns.clone();
                for q in &query.queries {
                    let name = q.name().to_lowercase();
                    reply.add_query(q.clone());
                    for r in zone.lock().iter() {
                        if r.name.to_lowercase() == name && r.record_type() == q.query_type() {
                            reply.add_answer(r.clone());
                        }
                    }
                }
                if reply.answers.is_empty() {
                    reply.metadata.response_code = ResponseCode::NXDomain;
                }
                let _ = socket.send_to(&reply.to_vec().unwrap(), from).await;
            }
        });
        Dns { addr, records }
    }

    /// Replaces the SRV records of `_mongodb._tcp.{name}` with one per
    /// target (`host:port`).
    pub fn set_srv(&self, name: &str, targets: &[&str]) {
        let owner = Name::from_ascii(format!("_mongodb._tcp.{name}.")).unwrap();
        let mut records = self.records.lock();
        records.retain(|r| r.name != owner);
        for t in targets {
            let (host, port) = t.rsplit_once(':').unwrap();
            records.push(Record::from_rdata(
                owner.clone(),
                1,
                RData::SRV(SRV::new(
                    0,
                    0,
                    port.parse().unwrap(),
                    Name::from_ascii(format!("{host}.")).unwrap(),
                )),
            ));
        }
    }

    /// Replaces the TXT record of `name`.
    pub fn set_txt(&self, name: &str, text: &str) {
        let owner = Name::from_ascii(format!("{name}.")).unwrap();
        let mut records = self.records.lock();
        records.retain(|r| !(r.name == owner && matches!(r.data, RData::TXT(_))));
        records.push(Record::from_rdata(
            owner,
            1,
            RData::TXT(TXT::new(vec![text.to_owned()])),
        ));
    }
}
