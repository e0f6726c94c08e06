import { createServer as createHttpServer, type Server as HttpServer } from 'node:http';
import { createServer as createTcpServer, type Server as TcpServer } from 'node:net';
import { createSocket, type Socket as UdpSocket } from 'node:dgram';

/**
 * The demo's backends, on loopback only: HTTP servers that say who they are (so round-robin is
 * visible), and a TCP and a UDP echo.
 */
export interface DemoBackends {
  close(): Promise<void>;
}

function listenHttp(host: string, port: number): Promise<HttpServer> {
  const server = createHttpServer((req, res) => {
    const body = `hello from backend ${host}:${port} (you asked for ${req.url})\n`;
    res.writeHead(200, { 'Content-Type': 'text/plain', 'Content-Length': Buffer.byteLength(body) });
    res.end(body);
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve(server));
  });
}

function listenTcpEcho(host: string, port: number): Promise<TcpServer> {
  const server = createTcpServer({ allowHalfOpen: true }, (s) => {
    s.on('error', () => s.destroy());
    s.pipe(s);
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve(server));
  });
}

function listenUdpEcho(host: string, port: number): Promise<UdpSocket> {
  const sock = createSocket('udp4');
  sock.on('message', (msg, rinfo) => sock.send(msg, rinfo.port, rinfo.address));
  return new Promise((resolve, reject) => {
    sock.once('error', reject);
    sock.bind(port, host, () => resolve(sock));
  });
}

export async function startDemoBackends(): Promise<DemoBackends> {
  const http = await Promise.all([listenHttp('127.0.10.1', 8080), listenHttp('127.0.10.2', 8080)]);
  const tcp = await listenTcpEcho('127.0.10.3', 7007);
  const udp = await listenUdpEcho('127.0.10.3', 7007);
  return {
    async close() {
      udp.close();
      await Promise.all([...http, tcp].map((s) => new Promise<void>((r) => {
        s.close(() => r());
        if ('closeAllConnections' in s) s.closeAllConnections();
      })));
    },
  };
}
