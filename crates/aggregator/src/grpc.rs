//! `WatchView` over gRPC: a thin adapter over [`ViewPublisher::subscribe`].

use crate::catalogue as m;
use std::pin::Pin;
use std::sync::Arc;

use flotilla_proto::v1::{self, view_service_server::ViewService, view_update::Update};
use flotilla_proto::{MAX_GRPC_MESSAGE, SNAPSHOT_CHUNK_NODES, VIEW_KEEPALIVE};
use flotilla_view::{ShardView, Start, ViewPublisher, delta_to_wire, record_to_wire};
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

pub struct ViewGrpc {
    publisher: Arc<ViewPublisher>,
    subscribers: metrics::Gauge,
    /// Ends every open stream when the shard stops.
    shutdown: watch::Receiver<bool>,
}

impl ViewGrpc {
    pub fn new(publisher: Arc<ViewPublisher>, shard: usize, shutdown: watch::Receiver<bool>) -> Self {
        ViewGrpc {
            publisher,
            subscribers: metrics::gauge!(m::WATCHVIEW_SUBSCRIBERS.name, "shard" => shard.to_string()),
            shutdown,
        }
    }

    pub fn into_server(self) -> v1::view_service_server::ViewServiceServer<Self> {
        v1::view_service_server::ViewServiceServer::new(self).max_encoding_message_size(MAX_GRPC_MESSAGE)
    }
}

type Tx = mpsc::Sender<Result<v1::ViewUpdate, Status>>;

async fn send_snapshot(tx: &Tx, view: &ShardView) -> bool {
    let version = Some(view.version.into());
    let mut nodes = Vec::with_capacity(SNAPSHOT_CHUNK_NODES.min(view.len()));
    let total = view.len();
    let mut sent = 0;
    for rec in view.nodes.values() {
        nodes.push(record_to_wire(rec));
        sent += 1;
        if nodes.len() == SNAPSHOT_CHUNK_NODES || sent == total {
            let chunk = v1::SnapshotChunk {
                version,
                shard: view.shard,
                nodes: std::mem::take(&mut nodes),
                last: sent == total,
            };
            if tx.send(Ok(v1::ViewUpdate { update: Some(Update::Snapshot(chunk)) })).await.is_err() {
                return false;
            }
        }
    }
    if total == 0 {
        let chunk = v1::SnapshotChunk { version, shard: view.shard, nodes: vec![], last: true };
        return tx.send(Ok(v1::ViewUpdate { update: Some(Update::Snapshot(chunk)) })).await.is_ok();
    }
    true
}

/// Streams one subscription until the client goes away.
async fn stream_view(publisher: Arc<ViewPublisher>, from: Option<flotilla_view::Version>, tx: Tx) {
    let mut sub = publisher.subscribe(from);
    loop {
        let ok = match std::mem::replace(&mut sub.start, Start::Deltas(Vec::new())) {
            Start::Snapshot(view) => send_snapshot(&tx, &view).await,
            Start::Deltas(ds) if ds.is_empty() => {
                // Tell the client it is current.
                tx.send(Ok(v1::ViewUpdate { update: None })).await.is_ok()
            }
            Start::Deltas(ds) => {
                let mut ok = true;
                for d in ds {
                    ok &= tx.send(Ok(v1::ViewUpdate { update: Some(Update::Delta(delta_to_wire(&d))) })).await.is_ok();
                }
                ok
            }
        };
        if !ok {
            return;
        }
        loop {
            let next = tokio::time::timeout(VIEW_KEEPALIVE, sub.rx.recv()).await;
            let Ok(next) = next else {
                if tx.send(Ok(v1::ViewUpdate { update: None })).await.is_err() {
                    return;
                }
                continue;
            };
            match next {
                Ok(d) => {
                    let u = v1::ViewUpdate { update: Some(Update::Delta(delta_to_wire(&d))) };
                    if tx.send(Ok(u)).await.is_err() {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    // Too slow for the ring: start over from a snapshot.
                    tracing::debug!(lagged = n, "view subscriber fell behind; sending a snapshot");
                    metrics::counter!(m::WATCHVIEW_RESNAPSHOTS.name).increment(1);
                    sub = publisher.subscribe(None);
                    break;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }
}

#[tonic::async_trait]
impl ViewService for ViewGrpc {
    type WatchViewStream = Pin<Box<dyn Stream<Item = Result<v1::ViewUpdate, Status>> + Send + 'static>>;

    #[tracing::instrument(skip_all, fields(from = ?request.get_ref().from_version))]
    async fn watch_view(
        &self,
        request: Request<v1::WatchViewRequest>,
    ) -> Result<Response<Self::WatchViewStream>, Status> {
        let from = request.into_inner().from_version.map(Into::into);
        let (tx, rx) = mpsc::channel(64);
        let publisher = self.publisher.clone();
        let gauge = self.subscribers.clone();
        let mut shutdown = self.shutdown.clone();
        gauge.increment(1.0);
        tokio::spawn(async move {
            tokio::select! {
                _ = stream_view(publisher, from, tx) => {}
                _ = shutdown.wait_for(|stop| *stop) => {}
            }
            gauge.decrement(1.0);
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
