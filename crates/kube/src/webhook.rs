//! The mutating admission webhook: `AdmissionReview` in, the shaping patch (or a refusal the user
//! sees at `kubectl apply`) out, over HTTPS with rustls.

use crate::shaping::{self, OPT_IN_LABEL, OPT_IN_VALUE, ShapeConfig};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::Pod;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::{self, pki_types};

/// The path the `MutatingWebhookConfiguration` calls.
pub const MUTATE_PATH: &str = "/mutate";
/// The API server sends at most 3 MiB objects; a review of one fits in this.
const MAX_BODY: usize = 8 << 20;

/// What can stop the webhook server.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("reading {path}: {source}")]
    Pem {
        path: PathBuf,
        #[source]
        source: pki_types::pem::Error,
    },
    #[error("{0} holds no certificate")]
    NoCertificate(PathBuf),
    #[error("TLS configuration: {0}")]
    Tls(#[source] rustls::Error),
    #[error("accepting connections: {0}")]
    Accept(#[source] std::io::Error),
}

/// Answers one `AdmissionReview` (the request body) with the review to send back.
pub fn review(body: &[u8], config: &ShapeConfig) -> AdmissionReview<DynamicObject> {
    let review: AdmissionReview<Pod> = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(e) => return AdmissionResponse::invalid(e).into_review(),
    };
    let request: AdmissionRequest<Pod> = match review.try_into() {
        Ok(request) => request,
        Err(e) => return AdmissionResponse::invalid(e).into_review(),
    };
    respond(&request, config).into_review()
}

fn respond(request: &AdmissionRequest<Pod>, config: &ShapeConfig) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    let Some(pod) = request.object.as_ref() else {
        return response;
    };
    // The objectSelector already keeps other pods away; checked again so that a configuration
    // edited by hand cannot shape pods that did not opt in.
    let opted_in = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(OPT_IN_LABEL))
        .is_some_and(|v| v == OPT_IN_VALUE);
    if !opted_in || request.operation != Operation::Create {
        return response;
    }
    let name = pod
        .metadata
        .name
        .as_deref()
        .or(pod.metadata.generate_name.as_deref())
        .unwrap_or("<unnamed>");
    match shaping::shape(pod, config) {
        Ok(ops) if ops.is_empty() => response,
        Ok(ops) => {
            let patch: json_patch::Patch = match serde_json::from_value(ops.into()) {
                Ok(patch) => patch,
                Err(e) => return response.deny(format!("internal error building the patch: {e}")),
            };
            tracing::info!(
                pod = name,
                namespace = request.namespace.as_deref(),
                "shaped"
            );
            response
                .with_patch(patch)
                .unwrap_or_else(AdmissionResponse::invalid)
        }
        Err(refusal) => {
            tracing::info!(pod = name, namespace = request.namespace.as_deref(), %refusal, "refused");
            response.deny(refusal)
        }
    }
}

/// The server's certificate chain and key from PEM files.
pub fn tls_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig, WebhookError> {
    use pki_types::pem::PemObject;
    fn pem(path: &Path) -> impl FnOnce(pki_types::pem::Error) -> WebhookError + '_ {
        move |source| WebhookError::Pem {
            path: path.to_path_buf(),
            source,
        }
    }
    let chain = pki_types::CertificateDer::pem_file_iter(cert)
        .map_err(pem(cert))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem(cert))?;
    if chain.is_empty() {
        return Err(WebhookError::NoCertificate(cert.to_path_buf()));
    }
    let key = pki_types::PrivateKeyDer::from_pem_file(key).map_err(pem(key))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(WebhookError::Tls)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(WebhookError::Tls)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Serves `/mutate` and `/healthz` on `listener` until the task is dropped.
pub async fn serve(
    listener: TcpListener,
    tls: rustls::ServerConfig,
    config: ShapeConfig,
) -> Result<(), WebhookError> {
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let config = Arc::new(config);
    loop {
        let (stream, peer) = listener.accept().await.map_err(WebhookError::Accept)?;
        let acceptor = acceptor.clone();
        let config = config.clone();
        tokio::spawn(async move {
            // A client that fails the handshake (a wrong CA on its side, a port scan) only ends its
            // own connection.
            let stream = match acceptor.accept(stream).await {
                Ok(stream) => stream,
                Err(e) => {
                    tracing::debug!(%peer, "TLS handshake failed: {e}");
                    return;
                }
            };
            let service = hyper::service::service_fn(move |request| {
                let config = config.clone();
                async move { Ok::<_, std::convert::Infallible>(handle(request, &config).await) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%peer, "connection ended: {e}");
            }
        });
    }
}

async fn handle(request: Request<Incoming>, config: &ShapeConfig) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, body: Vec<u8>, json: bool| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        if json {
            response.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("application/json"),
            );
        }
        response
    };
    match (request.method(), request.uri().path()) {
        (&Method::GET, "/healthz") => reply(StatusCode::OK, b"ok\n".to_vec(), false),
        (&Method::POST, MUTATE_PATH) => {
            let body = match Limited::new(request.into_body(), MAX_BODY).collect().await {
                Ok(body) => body.to_bytes(),
                Err(e) => {
                    return reply(
                        StatusCode::BAD_REQUEST,
                        format!("reading the request: {e}\n").into_bytes(),
                        false,
                    );
                }
            };
            let review = review(&body, config);
            // An AdmissionReview of plain data always serializes.
            let body = serde_json::to_vec(&review).expect("AdmissionReview serializes");
            reply(StatusCode::OK, body, true)
        }
        _ => reply(StatusCode::NOT_FOUND, b"not found\n".to_vec(), false),
    }
}
