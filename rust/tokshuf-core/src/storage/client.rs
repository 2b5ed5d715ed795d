//! The process's connection to object stores: one small tokio runtime and one client per
//! (store, bucket, environment), made on first use, never at import.
//!
//! Fork safety: both live in a `PerProcess` slot keyed by pid, so a forked child (a
//! DataLoader worker) builds its own runtime instead of using one whose threads it lacks.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures_util::future::{select, Either};

use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::multipart::MultipartStore;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};
use sha2::{Digest, Sha256};

use super::location::{RemoteUrl, Scheme};
use crate::error::{Error, Result};
use crate::read::per_process::PerProcess;

/// Network behaviour, from the environment (documented in docs/storage.md).
#[derive(Clone, Debug)]
pub struct Settings {
    /// Retries of one request, and tries without progress of one streamed read.
    pub retries: usize,
    /// A connection silent this long (no response, no body bytes) is given up and retried.
    pub timeout: Duration,
    /// First backoff; doubles per retry up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
    /// Multipart part size; files larger than one part are uploaded in parts.
    pub part_size: usize,
    /// Parts uploaded at once.
    pub upload_parallelism: usize,
}

impl Settings {
    pub fn from_env() -> Settings {
        fn var<T: std::str::FromStr>(name: &str) -> Option<T> {
            std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
        }
        let secs =
            |name: &str, default: f64| Duration::from_secs_f64(var::<f64>(name).filter(|v| v.is_finite() && *v >= 0.0).unwrap_or(default));
        Settings {
            retries: var("TOKSHUF_REMOTE_RETRIES").unwrap_or(10),
            timeout: secs("TOKSHUF_REMOTE_TIMEOUT", 30.0).max(Duration::from_millis(10)),
            backoff: secs("TOKSHUF_REMOTE_BACKOFF", 0.1),
            max_backoff: Duration::from_secs(15),
            // S3 needs parts of at least 5 MiB (all but the last).
            part_size: var::<usize>("TOKSHUF_REMOTE_PART_SIZE").unwrap_or(16 << 20).max(5 << 20),
            upload_parallelism: var::<usize>("TOKSHUF_REMOTE_UPLOADS").unwrap_or(4).max(1),
        }
    }

    /// Backoff before retry number `attempt` (1-based), with jitter so that parallel
    /// readers hitting the same throttle do not retry in lockstep.
    pub fn delay(&self, attempt: usize) -> Duration {
        let exp = self.backoff.saturating_mul(1u32 << attempt.saturating_sub(1).min(16) as u32);
        let base = exp.min(self.max_backoff);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        let jitter = crate::hash::mix64(nanos as u64 ^ ((attempt as u64) << 32)) % 1000;
        base.mul_f64(0.5 + jitter as f64 / 2000.0)
    }
}

/// A client for one bucket: the generic API, and the part-level multipart API (so one part
/// can be retried alone).
#[derive(Clone)]
pub struct Client {
    pub store: Arc<dyn ObjectStore>,
    pub multipart: Arc<dyn MultipartStore>,
    pub settings: Settings,
}

/// Clients by (store, bucket, fingerprint of the configuring environment).
type ClientKey = (Scheme, String, [u8; 32]);

struct State {
    runtime: tokio::runtime::Runtime,
    clients: Mutex<HashMap<ClientKey, Client>>,
}

fn state() -> Result<&'static State> {
    static SLOT: OnceLock<PerProcess<std::result::Result<State, String>>> = OnceLock::new();
    let made = SLOT.get_or_init(PerProcess::new).get(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("tokshuf-io")
            .enable_all()
            .build()
            .map(|runtime| State { runtime, clients: Mutex::new(HashMap::new()) })
            .map_err(|e| e.to_string())
    });
    made.as_ref().map_err(|e| Error::Config(format!("cannot start the object-store runtime: {e}")))
}

/// Counts the user's interrupts (Ctrl-C, which the bindings see): a request in flight when it
/// changes gives up with `Error::Interrupted`, so a connection that hangs does not hold an
/// interrupt for minutes of timeouts and retries. Requests begun after it run as usual.
static INTERRUPTS: AtomicU64 = AtomicU64::new(0);

/// The user interrupted: requests in flight give up.
pub fn interrupt() {
    INTERRUPTS.fetch_add(1, Ordering::Relaxed);
}

/// Now, as `block_on_since` and `sleep_since` count interrupts.
pub fn epoch() -> u64 {
    INTERRUPTS.load(Ordering::Relaxed)
}

/// `fut` on the process's runtime, given up if the user interrupts meanwhile.
pub fn block_on<T>(fut: impl Future<Output = T>) -> Result<T> {
    block_on_since(epoch(), fut)
}

/// `block_on` for work begun at `since` (a read of many requests keeps its first epoch).
pub fn block_on_since<T>(since: u64, fut: impl Future<Output = T>) -> Result<T> {
    let rt = runtime()?;
    rt.block_on(async move {
        let watch = async move {
            while epoch() == since {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        match select(std::pin::pin!(fut), std::pin::pin!(watch)).await {
            Either::Left((v, _)) => Ok(v),
            Either::Right(_) => Err(Error::Interrupted),
        }
    })
}

/// Sleep `d` (a backoff between retries), waking to give up if the user interrupts.
pub fn sleep_since(since: u64, d: Duration) -> Result<()> {
    let end = Instant::now() + d;
    loop {
        if epoch() != since {
            return Err(Error::Interrupted);
        }
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

/// The process's runtime (started on first use).
pub fn runtime() -> Result<&'static tokio::runtime::Runtime> {
    Ok(&state()?.runtime)
}

/// Environment variables that configure the stores, with their values: part of the client key,
/// so a changed endpoint or credential gets a fresh client.
fn env_fingerprint() -> [u8; 32] {
    let mut vars: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| ["AWS_", "GOOGLE_", "AZURE_", "TOKSHUF_REMOTE_"].iter().any(|p| k.starts_with(p)))
        .collect();
    vars.sort();
    let mut h = Sha256::new();
    for (k, v) in vars {
        h.update(k.as_bytes());
        h.update([0]);
        h.update(v.as_bytes());
        h.update([0]);
    }
    h.finalize().into()
}

/// The client for `url`'s bucket.
pub fn client(url: &RemoteUrl) -> Result<Client> {
    let st = state()?;
    let key = (url.scheme, url.bucket.clone(), env_fingerprint());
    let mut clients = st.clients.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(c) = clients.get(&key) {
        return Ok(c.clone());
    }
    let settings = Settings::from_env();
    let made = {
        // Builders may spawn nothing, but some read the runtime handle: build inside it.
        let _guard = st.runtime.enter();
        build(url, &settings)
    }?;
    clients.insert(key, made.clone());
    Ok(made)
}

fn build(url: &RemoteUrl, s: &Settings) -> Result<Client> {
    let retry = RetryConfig {
        backoff: BackoffConfig { init_backoff: s.backoff, max_backoff: s.max_backoff, base: 2.0 },
        max_retries: s.retries,
        retry_timeout: Duration::from_secs(180).max(s.timeout * 3),
    };
    // No whole-request timeout: a large object streams for as long as bytes keep coming;
    // a stall (no bytes for `timeout`) is what counts as a failure.
    let mut options = ClientOptions::new()
        .with_timeout_disabled()
        .with_read_timeout(s.timeout)
        .with_connect_timeout(s.timeout.min(Duration::from_secs(10)));
    // The client options given here replace those the builders read from the environment,
    // so the store's own ALLOW_HTTP variable is read here.
    let allow_http = |var: &str| std::env::var(var).is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes"));
    let var = match url.scheme {
        Scheme::S3 => "AWS_ALLOW_HTTP",
        Scheme::Gcs => "GOOGLE_ALLOW_HTTP",
        Scheme::Azure => "AZURE_ALLOW_HTTP",
    };
    if allow_http(var) {
        options = options.with_allow_http(true);
    }
    let fail = |e: object_store::Error| Error::Config(super::redact(&format!("{url}: cannot configure the object store client: {e}")));
    let (store, multipart): (Arc<dyn ObjectStore>, Arc<dyn MultipartStore>) = match url.scheme {
        Scheme::S3 => {
            let endpoint = std::env::var("AWS_ENDPOINT_URL_S3").or_else(|_| std::env::var("AWS_ENDPOINT_URL")).ok();
            if endpoint.as_deref().is_some_and(is_loopback_http) {
                options = options.with_allow_http(true);
            }
            let mut b = AmazonS3Builder::from_env().with_bucket_name(&url.bucket).with_retry(retry).with_client_options(options);
            if std::env::var("AWS_REGION").is_err() && std::env::var("AWS_DEFAULT_REGION").is_err() {
                b = b.with_region("us-east-1");
            }
            if let Some(e) = endpoint {
                // object_store takes any string here and panics on its first request if it is
                // not a URL.
                if !(e.starts_with("http://") || e.starts_with("https://")) {
                    return Err(Error::Config(super::redact(&format!(
                        "{url}: the endpoint {e:?} (AWS_ENDPOINT_URL) is not an http:// or https:// URL"
                    ))));
                }
                if e.starts_with("http://") && !is_loopback_http(&e) && !allow_http(var) {
                    return Err(Error::Config(super::redact(&format!(
                        "{url}: the endpoint {e:?} is plain http://: set AWS_ALLOW_HTTP=true to allow it"
                    ))));
                }
                b = b.with_endpoint(e);
            }
            let st = Arc::new(b.build().map_err(fail)?);
            (st.clone(), st)
        }
        Scheme::Gcs => {
            let st = Arc::new(
                GoogleCloudStorageBuilder::from_env()
                    .with_bucket_name(&url.bucket)
                    .with_retry(retry)
                    .with_client_options(options)
                    .build()
                    .map_err(fail)?,
            );
            (st.clone(), st)
        }
        Scheme::Azure => {
            let st = Arc::new(
                MicrosoftAzureBuilder::from_env()
                    .with_container_name(&url.bucket)
                    .with_retry(retry)
                    .with_client_options(options)
                    .build()
                    .map_err(fail)?,
            );
            (st.clone(), st)
        }
    };
    Ok(Client { store, multipart, settings: s.clone() })
}

/// `http://` to this machine only: plain HTTP is for test and local S3 servers.
fn is_loopback_http(endpoint: &str) -> bool {
    let Some(rest) = endpoint.strip_prefix("http://") else { return false };
    let host_port = rest.split('/').next().unwrap_or("");
    let host = if let Some(v6) = host_port.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        host_port.rsplit_once(':').map(|(h, _)| h).unwrap_or(host_port)
    };
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback() {
        assert!(is_loopback_http("http://127.0.0.1:9000"));
        assert!(is_loopback_http("http://localhost:9000/"));
        assert!(is_loopback_http("http://[::1]:9000"));
        assert!(!is_loopback_http("http://10.0.0.1:9000"));
        assert!(!is_loopback_http("https://127.0.0.1:9000"));
        assert!(!is_loopback_http("http://127.0.0.1.evil.com"));
    }

    #[test]
    fn delays_grow_and_cap() {
        let s = Settings {
            retries: 3,
            timeout: Duration::from_secs(1),
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            part_size: 5 << 20,
            upload_parallelism: 1,
        };
        assert!(s.delay(1) >= Duration::from_millis(50) && s.delay(1) <= Duration::from_millis(100));
        assert!(s.delay(3) >= Duration::from_millis(200));
        assert!(s.delay(30) <= Duration::from_secs(1));
    }
}
