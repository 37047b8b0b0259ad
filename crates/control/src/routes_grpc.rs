//! `RouteService.WatchRoutes`: the route table of an app whose scheduler runs in this
//! process, at once and then on every change. Served on the API's own port (gRPC and
//! HTTP/1.1 share it).

use std::pin::Pin;
use std::sync::Arc;

use flotilla_proto::v1;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use crate::{ControlError, ControlState};

pub struct RoutesGrpc(pub Arc<ControlState>);

type TableStream = Pin<Box<dyn Stream<Item = Result<v1::RouteTable, Status>> + Send>>;

#[tonic::async_trait]
impl v1::route_service_server::RouteService for RoutesGrpc {
    type WatchRoutesStream = TableStream;

    #[tracing::instrument(skip_all, fields(app = %request.get_ref().app))]
    async fn watch_routes(
        &self,
        request: Request<v1::WatchRoutesRequest>,
    ) -> Result<Response<Self::WatchRoutesStream>, Status> {
        let app = request.into_inner().app;
        let refuse = |e: ControlError| flotilla_proto::status::status(&e);
        if app.is_empty() || app.len() > 63 {
            return Err(refuse(ControlError::BadRequest("app: 1..=63 bytes".into())));
        }
        match self.0.apps.get(&app) {
            Some(Ok(h)) => {
                metrics::counter!("flotilla_watchroutes_streams_total").increment(1);
                let rx = h.routes();
                let stream = tokio_stream::wrappers::WatchStream::new(rx).map(|t| Ok(t.as_ref().clone()));
                Ok(Response::new(Box::pin(stream)))
            }
            Some(Err(url)) => Err(refuse(ControlError::ScheduledElsewhere { app, url })),
            None => Err(refuse(ControlError::NoSuchApp(app))),
        }
    }
}
