//! A lease store client: etcd's v3 API over its HTTP/JSON gateway (keys
//! and values base64, numbers as strings), on plain HTTP/1.1 over loopback
//! or a private network. No pgrx: it runs only in the keeper process, and
//! every request is bounded in time (1 s to connect, 3 s in all).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde_json::{json, Value};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// The largest answer read (a range of every shard key is about 2 MB).
const MAX_ANSWER: usize = 16 << 20;

/// The store's endpoints, tried in turn, and the etcd cluster they belong
/// to: an answer from another cluster (an endpoint of another etcd listed by
/// mistake) is refused, so that two servers never lease the same shard from
/// two stores.
#[derive(Debug)]
pub struct Store {
    endpoints: Vec<String>,
    cluster: std::cell::RefCell<Option<String>>,
    /// The endpoint that answered last, tried first.
    last_good: std::cell::Cell<usize>,
}

/// A key as the store keeps it.
#[derive(Clone, Debug)]
pub struct Kv {
    pub key: String,
    pub value: String,
    pub lease: i64,
    /// The store's revision at which the key was created.
    pub created: i64,
}

impl Store {
    /// `http://host:port`, comma-separated.
    pub fn parse(urls: &str) -> Result<Store, String> {
        let mut endpoints = Vec::new();
        for url in urls.split(',').map(str::trim).filter(|u| !u.is_empty()) {
            let Some(rest) = url.strip_prefix("http://") else {
                return Err(format!("\"{url}\" is not an http:// address (TLS is not supported)"));
            };
            let hostport = rest.trim_end_matches('/');
            if hostport.is_empty() || hostport.contains('/') || !hostport.contains(':') {
                return Err(format!("\"{url}\" is not of the form http://host:port"));
            }
            endpoints.push(hostport.to_string());
        }
        if endpoints.is_empty() {
            return Err("no address".into());
        }
        Ok(Store { endpoints, cluster: std::cell::RefCell::new(None), last_good: std::cell::Cell::new(0) })
    }

    /// Asks every endpoint which cluster it belongs to: an error if two
    /// that answer belong to different clusters, or to another than
    /// `pinned` (the cluster this server leased from before). Pins the
    /// cluster and returns it.
    pub fn check_one_cluster(&self, pinned: Option<&str>) -> Result<String, String> {
        let mut seen: Vec<(String, String)> = Vec::new();
        for endpoint in &self.endpoints {
            if let Ok(v) = post_to(endpoint, "/v3/kv/range", &json!({ "key": b64("\0"), "keys_only": true, "limit": "1" }).to_string()) {
                if let Some(id) = cluster_of(&v) {
                    seen.push((endpoint.clone(), id));
                }
            }
        }
        let Some((first, id)) = seen.first() else { return Err("no address answered".into()) };
        if let Some((other, other_id)) = seen.iter().find(|(_, i)| i != id) {
            return Err(format!(
                "the addresses of pg_idgen.lease_store belong to different etcd clusters ({first}: cluster {id}, {other}: cluster {other_id})"
            ));
        }
        if let Some(p) = pinned.filter(|p| p != id) {
            return Err(format!(
                "{first} belongs to etcd cluster {id}, not to cluster {p} this server leased from before (pg_idgen/lease_cluster in the data directory: remove it only if that etcd was rebuilt and every server moved)"
            ));
        }
        *self.cluster.borrow_mut() = Some(id.clone());
        Ok(id.clone())
    }

    /// One request, to each endpoint in turn until one answers.
    fn post(&self, path: &str, body: &Value) -> Result<Value, String> {
        let mut why = String::new();
        let n = self.endpoints.len();
        for i in (0..n).map(|k| (self.last_good.get() + k) % n) {
            let endpoint = &self.endpoints[i];
            match post_to(endpoint, path, &body.to_string()) {
                Ok(v) => {
                    let id = cluster_of(&v);
                    let mut pinned = self.cluster.borrow_mut();
                    match (pinned.as_ref(), id) {
                        (Some(p), Some(id)) if *p != id => {
                            why = format!("{endpoint}: belongs to etcd cluster {id}, not to cluster {p} of the other answers");
                        }
                        (None, Some(id)) => {
                            *pinned = Some(id);
                            self.last_good.set(i);
                            return Ok(v);
                        }
                        _ => {
                            self.last_good.set(i);
                            return Ok(v);
                        }
                    }
                }
                Err(e) => why = format!("{endpoint}: {e}"),
            }
        }
        Err(why)
    }

    /// A new lease: (ID, TTL in seconds).
    pub fn grant(&self, ttl_s: i64) -> Result<(i64, i64), String> {
        let v = self.post("/v3/lease/grant", &json!({ "TTL": ttl_s }))?;
        Ok((int(&v["ID"]).ok_or("no lease ID in the answer")?, int(&v["TTL"]).unwrap_or(0)))
    }

    /// Renews a lease: the TTL granted, 0 when the lease is gone.
    pub fn keepalive(&self, id: i64) -> Result<i64, String> {
        let v = self.post("/v3/lease/keepalive", &json!({ "ID": id.to_string() }))?;
        Ok(int(&v["result"]["TTL"]).unwrap_or(0))
    }

    /// Another holder's lease: the seconds it has left (rounded down; -1
    /// once it ran out) and the seconds it was granted. (The gateway leaves
    /// out values of 0.)
    pub fn time_to_live(&self, id: i64) -> Result<(i64, i64), String> {
        let v = self.post("/v3/lease/timetolive", &json!({ "ID": id.to_string() }))?;
        Ok((int(&v["TTL"]).unwrap_or(0), int(&v["grantedTTL"]).unwrap_or(0)))
    }

    pub fn revoke(&self, id: i64) -> Result<(), String> {
        self.post("/v3/lease/revoke", &json!({ "ID": id.to_string() })).map(|_| ())
    }

    /// Every key that starts with `prefix`.
    pub fn range_prefix(&self, prefix: &str) -> Result<Vec<Kv>, String> {
        let v = self.post("/v3/kv/range", &json!({ "key": b64(prefix), "range_end": b64(&prefix_end(prefix)) }))?;
        Ok(kvs(&v))
    }

    /// Creates `key` under lease `lease` if no such key exists, reading
    /// `also` in the same transaction: Some(that key) if it was created.
    pub fn create(&self, key: &str, value: &str, lease: i64, also: &str) -> Result<Option<Option<Kv>>, String> {
        let absent = json!({ "key": b64(key), "target": "CREATE", "create_revision": "0" });
        self.claim(vec![absent], key, value, lease, also)
    }

    /// Attaches `key` (as it was read: `held`) to `lease` instead, if it
    /// is still that key under the same lease, and `leader_key` still holds
    /// `leader_name` and was created after it (the election came after the
    /// holder took the key); in the same transaction reads `also`. As
    /// [`Store::create`].
    pub fn take_over(
        &self,
        held: &Kv,
        (leader_key, leader_name): (&str, &str),
        value: &str,
        lease: i64,
        also: &str,
    ) -> Result<Option<Option<Kv>>, String> {
        let compare = vec![
            json!({ "key": b64(&held.key), "target": "LEASE", "lease": held.lease.to_string() }),
            json!({ "key": b64(&held.key), "target": "CREATE", "create_revision": held.created.to_string() }),
            json!({ "key": b64(leader_key), "target": "VALUE", "value": b64(leader_name) }),
            json!({ "key": b64(leader_key), "target": "CREATE", "result": "GREATER", "create_revision": held.created.to_string() }),
        ];
        self.claim(compare, &held.key, value, lease, also)
    }

    fn claim(&self, compare: Vec<Value>, key: &str, value: &str, lease: i64, also: &str) -> Result<Option<Option<Kv>>, String> {
        let v = self.post(
            "/v3/kv/txn",
            &json!({
                "compare": compare,
                "success": [
                    { "request_put": { "key": b64(key), "value": b64(value), "lease": lease.to_string() } },
                    { "request_range": { "key": b64(also) } },
                ],
            }),
        )?;
        if v["succeeded"].as_bool() != Some(true) {
            return Ok(None);
        }
        Ok(Some(kvs(&v["responses"][1]["response_range"]).into_iter().next()))
    }

    /// The value of one key, if it is there.
    pub fn get(&self, key: &str) -> Result<Option<String>, String> {
        let v = self.post("/v3/kv/range", &json!({ "key": b64(key) }))?;
        Ok(kvs(&v).into_iter().find(|kv| kv.key == key).map(|kv| kv.value))
    }

    /// Deletes `key` if it is still attached to `lease`.
    pub fn delete_if_held(&self, key: &str, lease: i64) -> Result<(), String> {
        self.post(
            "/v3/kv/txn",
            &json!({
                "compare": [{ "key": b64(key), "target": "LEASE", "lease": lease.to_string() }],
                "success": [{ "request_delete_range": { "key": b64(key) } }],
            }),
        )
        .map(|_| ())
    }

    /// Writes `puts` if every key of `held` is still attached to `lease`:
    /// whether it did.
    pub fn put_if_held(&self, held: &[String], lease: i64, puts: &[(String, String)]) -> Result<bool, String> {
        let compare: Vec<Value> =
            held.iter().map(|k| json!({ "key": b64(k), "target": "LEASE", "lease": lease.to_string() })).collect();
        let success: Vec<Value> =
            puts.iter().map(|(k, v)| json!({ "request_put": { "key": b64(k), "value": b64(v) } })).collect();
        let v = self.post("/v3/kv/txn", &json!({ "compare": compare, "success": success }))?;
        Ok(v["succeeded"].as_bool() == Some(true))
    }
}

/// The etcd cluster an answer comes from (its header's `cluster_id`).
fn cluster_of(v: &Value) -> Option<String> {
    let header = if v.get("result").is_some() { &v["result"]["header"] } else { &v["header"] };
    header["cluster_id"].as_str().map(str::to_string)
}

fn b64(s: &str) -> String {
    B64.encode(s.as_bytes())
}

fn unb64(v: &Value) -> String {
    v.as_str().and_then(|s| B64.decode(s).ok()).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

/// A number the gateway sends as a string (or, rarely, as a number).
fn int(v: &Value) -> Option<i64> {
    v.as_str().and_then(|s| s.parse().ok()).or_else(|| v.as_i64())
}

fn kvs(range: &Value) -> Vec<Kv> {
    range["kvs"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|kv| Kv {
                    key: unb64(&kv["key"]),
                    value: unb64(&kv["value"]),
                    lease: int(&kv["lease"]).unwrap_or(0),
                    created: int(&kv["create_revision"]).unwrap_or(0),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The end of the range of keys starting with `prefix` (its last byte plus one).
fn prefix_end(prefix: &str) -> String {
    let mut b = prefix.as_bytes().to_vec();
    if let Some(last) = b.last_mut() {
        *last += 1;
    }
    String::from_utf8_lossy(&b).into_owned()
}

/// One HTTP/1.1 POST of JSON, answered 200 with JSON.
fn post_to(endpoint: &str, path: &str, body: &str) -> Result<Value, String> {
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    let addrs: Vec<SocketAddr> = endpoint.to_socket_addrs().map_err(|e| e.to_string())?.collect();
    let mut last = String::from("no address");
    let mut stream = None;
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = e.to_string(),
        }
    }
    let mut stream = stream.ok_or(last)?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {endpoint}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.set_write_timeout(Some(REQUEST_TIMEOUT)).map_err(|e| e.to_string())?;
    stream.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("timed out".into());
        }
        stream.set_read_timeout(Some(left)).map_err(|e| e.to_string())?;
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) if answer.len() + n <= MAX_ANSWER => answer.extend_from_slice(&buf[..n]),
            Ok(_) => return Err("answer too large".into()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.to_string()),
        }
    }
    let (status, chunked, body) = split_response(&answer)?;
    let body = if chunked { dechunk(body)? } else { body.to_vec() };
    let text = String::from_utf8_lossy(&body);
    if status != 200 {
        return Err(format!("HTTP {status}: {}", text.chars().take(200).collect::<String>()));
    }
    // A streamed answer (keepalive) may carry several objects: the first counts.
    let mut objects = serde_json::Deserializer::from_str(&text).into_iter::<Value>();
    match objects.next() {
        Some(Ok(v)) if v.get("error").is_some() => Err(format!("the store refused: {}", v["error"])),
        Some(Ok(v)) => Ok(v),
        _ => Err(format!("not JSON: {}", text.chars().take(200).collect::<String>())),
    }
}

/// (status, chunked, body) of an HTTP/1.1 response.
fn split_response(answer: &[u8]) -> Result<(u16, bool, &[u8]), String> {
    let end = answer.windows(4).position(|w| w == b"\r\n\r\n").ok_or("no HTTP header")?;
    let head = String::from_utf8_lossy(&answer[..end]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or("no HTTP status")?;
    let chunked = lines.any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    Ok((status, chunked, &answer[end + 4..]))
}

fn dechunk(mut body: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = body.windows(2).position(|w| w == b"\r\n").ok_or("truncated chunk")?;
        let size_text = String::from_utf8_lossy(&body[..eol]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16).map_err(|_| "bad chunk size")?;
        body = &body[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if body.len() < size {
            return Err("truncated chunk".into());
        }
        out.extend_from_slice(&body[..size]);
        body = body.get(size + 2..).unwrap_or(&[]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse() {
        assert_eq!(Store::parse("http://127.0.0.1:2379").unwrap().endpoints, vec!["127.0.0.1:2379"]);
        assert_eq!(Store::parse("http://a:1/, http://b:2").unwrap().endpoints, vec!["a:1", "b:2"]);
        assert!(Store::parse("https://a:1").unwrap_err().contains("TLS"));
        assert!(Store::parse("http://a").is_err());
        assert!(Store::parse("").is_err());
    }

    #[test]
    fn chunked_answers_are_joined() {
        let r = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4\r\n\":1}\r\n0\r\n\r\n";
        let (status, chunked, body) = split_response(r).unwrap();
        assert_eq!((status, chunked), (200, true));
        assert_eq!(dechunk(body).unwrap(), b"{\"a\":1}");
        assert!(dechunk(b"5\r\nab").is_err());
    }

    #[test]
    fn answers_name_their_cluster() {
        assert_eq!(cluster_of(&json!({"header": {"cluster_id": "7"}})), Some("7".into()));
        assert_eq!(cluster_of(&json!({"result": {"header": {"cluster_id": "8"}}})), Some("8".into()));
        assert_eq!(cluster_of(&json!({})), None);
    }

    #[test]
    fn prefix_ranges_end_after_the_prefix() {
        assert_eq!(prefix_end("/p/"), "/p0");
    }
}
