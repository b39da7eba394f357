//! A minimal RESP2 client for the Redis baseline: enough to send commands,
//! pipeline them, and read replies.

use std::io;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufStream};
use tokio::net::TcpStream;

/// A Redis reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Simple(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

/// One connection.
pub(crate) struct Conn {
    stream: BufStream<TcpStream>,
}

impl Conn {
    pub(crate) async fn connect(port: u16) -> io::Result<Self> {
        let stream = TcpStream::connect(("127.0.0.1", port)).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream: BufStream::new(stream),
        })
    }

    fn encode(&mut self, args: &[&[u8]], out: &mut Vec<u8>) {
        out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for arg in args {
            out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            out.extend_from_slice(arg);
            out.extend_from_slice(b"\r\n");
        }
    }

    /// Sends one command and reads its reply.
    pub(crate) async fn cmd(&mut self, args: &[&[u8]]) -> io::Result<Reply> {
        let mut out = Vec::new();
        self.encode(args, &mut out);
        self.stream.write_all(&out).await?;
        self.stream.flush().await?;
        self.read().await
    }

    /// Sends many commands at once, then reads all replies.
    pub(crate) async fn pipeline(&mut self, commands: &[Vec<Vec<u8>>]) -> io::Result<Vec<Reply>> {
        let mut out = Vec::new();
        for command in commands {
            let args: Vec<&[u8]> = command.iter().map(Vec::as_slice).collect();
            self.encode(&args, &mut out);
        }
        self.stream.write_all(&out).await?;
        self.stream.flush().await?;
        let mut replies = Vec::with_capacity(commands.len());
        for _ in commands {
            replies.push(self.read().await?);
        }
        Ok(replies)
    }

    async fn line(&mut self) -> io::Result<String> {
        let mut line = String::new();
        self.stream.read_line(&mut line).await?;
        if !line.ends_with("\r\n") {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        line.truncate(line.len() - 2);
        Ok(line)
    }

    fn read(&mut self) -> std::pin::Pin<Box<dyn Future<Output = io::Result<Reply>> + Send + '_>> {
        Box::pin(async move {
            let line = self.line().await?;
            let (kind, rest) = line.split_at(1.min(line.len()));
            let number = || {
                rest.parse::<i64>()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
            };
            match kind {
                "+" => Ok(Reply::Simple(rest.to_owned())),
                "-" => Err(io::Error::other(format!("redis error: {rest}"))),
                ":" => Ok(Reply::Int(number()?)),
                "$" => {
                    let len = number()?;
                    if len < 0 {
                        return Ok(Reply::Bulk(None));
                    }
                    let mut data = vec![0; len as usize + 2];
                    self.stream.read_exact(&mut data).await?;
                    data.truncate(len as usize);
                    Ok(Reply::Bulk(Some(data)))
                }
                "*" => {
                    let len = number()?;
                    if len < 0 {
                        return Ok(Reply::Array(None));
                    }
                    let mut items = Vec::with_capacity(len as usize);
                    for _ in 0..len {
                        items.push(self.read().await?);
                    }
                    Ok(Reply::Array(Some(items)))
                }
                _ => Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad reply {line:?}"),
                )),
            }
        })
    }
}
