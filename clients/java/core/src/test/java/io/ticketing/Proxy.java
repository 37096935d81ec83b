package io.ticketing;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;

/** A TCP proxy on 127.0.0.1 whose connections the test can cut (RST, both directions). */
final class Proxy implements AutoCloseable {
    private final ServerSocket listener;
    private final String targetHost;
    private final int targetPort;
    private final List<Socket[]> pairs = new CopyOnWriteArrayList<>();

    Proxy(String target) throws IOException {
        Endpoint ep = Endpoint.parse(target);
        this.targetHost = ep.host();
        this.targetPort = ep.port();
        this.listener = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
        Thread t = new Thread(this::acceptLoop, "proxy-accept");
        t.setDaemon(true);
        t.start();
    }

    String endpoint() {
        return "127.0.0.1:" + listener.getLocalPort();
    }

    int connections() {
        return pairs.size();
    }

    private void acceptLoop() {
        while (!listener.isClosed()) {
            try {
                Socket client = listener.accept();
                Socket server = new Socket(targetHost, targetPort);
                Socket[] pair = {client, server};
                pairs.add(pair);
                pump(client, server, pair);
                pump(server, client, pair);
            } catch (IOException e) {
                // listener closed, or the target refused: the client sees the close
            }
        }
    }

    private void pump(Socket from, Socket to, Socket[] pair) {
        Thread t = new Thread(() -> {
            byte[] buf = new byte[16 * 1024];
            try (InputStream in = from.getInputStream(); OutputStream out = to.getOutputStream()) {
                int n;
                while ((n = in.read(buf)) >= 0) {
                    out.write(buf, 0, n);
                    out.flush();
                }
            } catch (IOException ignored) {
                // cut
            }
            cut(pair);
        }, "proxy-pump");
        t.setDaemon(true);
        t.start();
    }

    /** Cuts every connection through the proxy with RST on both sides; new ones may follow. */
    void cutAll() {
        for (Socket[] p : pairs) {
            cut(p);
        }
    }

    private void cut(Socket[] pair) {
        pairs.remove(pair);
        for (Socket s : pair) {
            try {
                s.setSoLinger(true, 0);
                s.close();
            } catch (IOException ignored) {
                // already closed
            }
        }
    }

    @Override
    public void close() throws IOException {
        listener.close();
        for (Socket[] p : pairs) {
            cut(p);
        }
    }
}
