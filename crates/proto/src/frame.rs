//! Length-prefixed messages on one stream (the log relay's chunks): a 4-byte
//! big-endian length, then the message. The length is checked before anything is read,
//! so a peer cannot make the reader allocate more than `max`.

use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt};

pub fn encode<M: Message>(msg: &M) -> Vec<u8> {
    let body = msg.encode_to_vec();
    let mut out = Vec::with_capacity(4 + body.len());
    // A message never nears 4 GiB: every writer bounds its chunks far below.
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("reading a frame: {0}")]
    Io(#[from] std::io::Error),
    #[error("a frame of {len} bytes (at most {max})")]
    TooLarge { len: usize, max: usize },
    #[error("a frame does not decode: {0}")]
    Malformed(#[from] prost::DecodeError),
}

/// The next message, or `None` at a clean end of the stream (between frames).
pub async fn read<M: Message + Default, R: AsyncRead + Unpin>(r: &mut R, max: usize) -> Result<Option<M>, FrameError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    Ok(Some(M::decode(body.as_slice())?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1;

    #[tokio::test]
    async fn frames_round_trip_and_oversized_ones_are_refused() {
        let chunk = v1::LogChunk {
            lines: vec![v1::LogLine { unix_ms: 5, text: "hello".into() }],
            dropped_lines: 2,
            error: None,
        };
        let mut bytes = encode(&chunk);
        bytes.extend(encode(&v1::LogChunk::default()));
        let mut r = bytes.as_slice();
        assert_eq!(read::<v1::LogChunk, _>(&mut r, 1024).await.unwrap(), Some(chunk.clone()));
        assert_eq!(read::<v1::LogChunk, _>(&mut r, 1024).await.unwrap(), Some(v1::LogChunk::default()));
        assert!(read::<v1::LogChunk, _>(&mut r, 1024).await.unwrap().is_none(), "a clean end");
        let big = encode(&chunk);
        assert!(matches!(read::<v1::LogChunk, _>(&mut big.as_slice(), 4).await, Err(FrameError::TooLarge { .. })));
        let cut = &big[..big.len() - 1];
        assert!(read::<v1::LogChunk, _>(&mut &cut[..], 1024).await.is_err(), "a frame cut short is an error");
    }
}
