//! `RouteService.WatchRoutes`: the route table of an app whose scheduler runs in this
//! process, at once and then on every change. Served on the API's own port (gRPC and
//! HTTP/1.1 share it).

use crate::catalogue as m;
use std::pin::Pin;
use std::sync::Arc;

use flotilla_proto::v1;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use crate::{ControlError, ControlState};

pub struct RoutesGrpc(pub Arc<ControlState>);

type TableStream = Pin<Box<dyn Stream<Item = Result<v1::RouteTable, Status>> + Send>>;
type CapacityStream = Pin<Box<dyn Stream<Item = Result<v1::Capacity, Status>> + Send>>;

/// The in-process scheduler of `app`, or why the stream is refused.
fn local_app(s: &ControlState, app: String) -> Result<flotilla_scheduler::AppHandle, Status> {
    let refuse = |e: ControlError| flotilla_proto::status::status(&e);
    if app.is_empty() || app.len() > 63 {
        return Err(refuse(ControlError::BadRequest("app: 1..=63 bytes".into())));
    }
    match s.apps.get(&app) {
        Some(Ok(h)) => Ok(h),
        Some(Err(url)) => Err(refuse(ControlError::ScheduledElsewhere { app, url })),
        None => Err(refuse(ControlError::NoSuchApp(app))),
    }
}

#[tonic::async_trait]
impl v1::route_service_server::RouteService for RoutesGrpc {
    type WatchRoutesStream = TableStream;
    type WatchCapacityStream = CapacityStream;

    #[tracing::instrument(skip_all, fields(app = %request.get_ref().app))]
    async fn watch_routes(
        &self,
        request: Request<v1::WatchRoutesRequest>,
    ) -> Result<Response<Self::WatchRoutesStream>, Status> {
        let h = local_app(&self.0, request.into_inner().app)?;
        metrics::counter!(m::WATCHROUTES_STREAMS.name).increment(1);
        let stream = tokio_stream::wrappers::WatchStream::new(h.routes()).map(|t| Ok(t.as_ref().clone()));
        Ok(Response::new(Box::pin(stream)))
    }

    /// The app's capacity at once, then on every change: consumers pace themselves by it.
    #[tracing::instrument(skip_all, fields(app = %request.get_ref().app))]
    async fn watch_capacity(
        &self,
        request: Request<v1::WatchRoutesRequest>,
    ) -> Result<Response<Self::WatchCapacityStream>, Status> {
        let h = local_app(&self.0, request.into_inner().app)?;
        metrics::counter!(m::WATCHCAPACITY_STREAMS.name).increment(1);
        let stream = tokio_stream::wrappers::WatchStream::new(h.capacity()).map(|c| Ok(c.as_ref().clone()));
        Ok(Response::new(Box::pin(stream)))
    }

    /// A router's per-version numbers, for the canary step its scheduler judges.
    #[tracing::instrument(skip_all, fields(app = %request.get_ref().app, router = %request.get_ref().router))]
    async fn report_traffic(&self, request: Request<v1::TrafficReport>) -> Result<Response<v1::TrafficAck>, Status> {
        // Reports decide a canary's promotion: only a router with the operate scope.
        let headers = request.metadata().clone().into_headers();
        let app = request.get_ref().app.clone();
        crate::auth::authorize(&self.0, &headers, crate::tokens::Scope::Operate, Some(&app))
            .map_err(|e| flotilla_proto::status::status(&e))?;
        let report = request.into_inner();
        let h = local_app(&self.0, report.app.clone())?;
        h.report_traffic(&report)
            .map_err(|e| flotilla_proto::status::status(&ControlError::BadRequest(format!("traffic report: {e}"))))?;
        Ok(Response::new(v1::TrafficAck {}))
    }
}
