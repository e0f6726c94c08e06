import { connect, type Socket } from 'node:net';
import type { Dialer, DialRequest } from '../../seams/dialer.js';

/**
 * Dials the endpoint directly over TCP. Half-open is allowed so a client's FIN can be passed on
 * while the reply still flows back; Nagle is off because the proxy only relays what the peers
 * already chose to write.
 */
export class DirectDialer implements Dialer {
  dial(req: DialRequest): Promise<Socket> {
    return new Promise((resolve, reject) => {
      const socket = connect({ host: req.endpoint.ip, port: req.endpoint.port, allowHalfOpen: true, noDelay: true, onread: req.onread });
      const onError = (err: Error): void => {
        clearTimeout(timer);
        reject(err);
      };
      // destroy() without an error emits no 'error', so the timeout rejection is the only outcome.
      const timer = setTimeout(() => {
        socket.off('error', onError);
        socket.destroy();
        reject(timeoutError(req));
      }, req.timeoutMs);
      socket.once('error', onError);
      socket.once('connect', () => {
        clearTimeout(timer);
        socket.off('error', onError);
        resolve(socket);
      });
    });
  }
}

function timeoutError(req: DialRequest): NodeJS.ErrnoException {
  const err: NodeJS.ErrnoException = new Error(`connect ETIMEDOUT ${req.endpoint.addr} (after ${req.timeoutMs} ms)`);
  err.code = 'ETIMEDOUT';
  err.syscall = 'connect';
  return err;
}
