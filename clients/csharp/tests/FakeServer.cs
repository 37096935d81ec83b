using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Net;
using System.Net.Sockets;
using System.Security.Cryptography;
using System.Text;
using System.Threading;
using NUnit.Framework;
using Ticketing.Protocol;

namespace Ticketing.Tests
{
    /// <summary>
    /// A scriptable server that speaks the handshake and hands every request to the test: for the
    /// failure paths a real single node cannot easily produce (GOAWAY, NOT_LEADER, a changed state
    /// id, dropped answers, a frozen peer, malformed frames).
    /// </summary>
    internal sealed class FakeServer : IDisposable
    {
        /// <summary>One request as received, with the connection it came on.</summary>
        internal sealed class Received
        {
            internal Conn Conn;
            internal RequestFrame Frame;

            internal Op Op => Frame.Op;

            internal ulong Id => Frame.RequestId;
        }

        /// <summary>One accepted connection.</summary>
        internal sealed class Conn
        {
            private readonly Socket _socket;
            private readonly Stream _out;

            internal Conn(Socket socket, Stream output, int index, byte[] sessionId, bool resumed)
            {
                _socket = socket;
                _out = output;
                Index = index;
                SessionId = sessionId;
                Resumed = resumed;
            }

            internal int Index { get; }

            internal byte[] SessionId { get; }

            internal bool Resumed { get; }

            internal void Send(ResponseFrame f)
            {
                SendRaw(f.Encode());
            }

            internal void SendRaw(byte[] b)
            {
                lock (this)
                {
                    try
                    {
                        _out.Write(b, 0, b.Length);
                        _out.Flush();
                    }
                    catch (Exception)
                    {
                        // the client went away
                    }
                }
            }

            internal void Reply(RequestFrame req, Status s, ulong token = 0, uint lease = 0, uint detail = 0, byte[] data = null)
            {
                Send(new ResponseFrame(req.Op, s, req.RequestId, token, lease, detail, data));
            }

            internal void Ok(RequestFrame req)
            {
                Reply(req, Status.Ok);
            }

            /// <summary>Closes with RST.</summary>
            internal void Kill()
            {
                try
                {
                    _socket.LingerState = new LingerOption(true, 0);
                    _socket.Close();
                }
                catch (Exception)
                {
                    // gone
                }
            }
        }

        private readonly TcpListener _listener;
        private readonly RandomNumberGenerator _rng = RandomNumberGenerator.Create();
        private int _index;

        internal readonly BlockingCollection<Received> Requests = new BlockingCollection<Received>();
        internal readonly BlockingCollection<Conn> Connections = new BlockingCollection<Conn>();
        internal readonly ConcurrentQueue<Conn> All = new ConcurrentQueue<Conn>();
        internal readonly ConcurrentQueue<string> Hellos = new ConcurrentQueue<string>();

        /// <summary>Sessions seen; share it between fakes to play a cluster that replicates sessions.</summary>
        internal HashSet<string> Sessions = new HashSet<string>();

        // settings the test may change between connections
        internal volatile byte[] StateId = new byte[16];
        internal volatile uint GraceMs = 5000;
        internal volatile bool Resume = true;
        internal volatile byte[] Token; // null: no auth
        internal volatile bool ForgeServerProof;
        internal volatile string NotLeaderHint; // non-null: CHALLENGE NOT_LEADER with this hint
        internal int NotLeaderNext; // that many next connections: CHALLENGE NOT_LEADER, no hint
        internal volatile int Refuse = -1; // a Status: CHALLENGE with it (BUSY, UNSUPPORTED_VERSION...); -1: none
        internal volatile bool AutoPing = true; // answer PING and ACK by itself
        internal volatile bool Frozen; // accept and read, never answer anything
        internal volatile int WelcomeDelayMs; // hold WELCOME back this long (a slow handshake's end)

        private bool TakeNotLeaderNext()
        {
            while (true)
            {
                int n = Volatile.Read(ref NotLeaderNext);
                if (n <= 0)
                {
                    return false;
                }
                if (Interlocked.CompareExchange(ref NotLeaderNext, n - 1, n) == n)
                {
                    return true;
                }
            }
        }

        internal FakeServer()
        {
            _listener = new TcpListener(IPAddress.Loopback, 0);
            _listener.Start();
            _rng.GetBytes(StateId);
            new Thread(AcceptLoop) { IsBackground = true, Name = "fake-server-accept" }.Start();
        }

        internal int Port => ((IPEndPoint)_listener.LocalEndpoint).Port;

        internal string Endpoint => "127.0.0.1:" + Port;

        internal void NewStateId()
        {
            byte[] s = new byte[16];
            _rng.GetBytes(s);
            StateId = s;
        }

        /// <summary>Waits for the next request (PING and ACK are answered by themselves while <see cref="AutoPing"/>).</summary>
        internal Received Next(int ms = 5000)
        {
            Received r;
            if (!Requests.TryTake(out r, ms))
            {
                Assert.Fail("no request within " + ms + " ms");
            }
            return r;
        }

        /// <summary>Waits for the next request, which must have this op.</summary>
        internal Received Expect(Op op, int ms = 5000)
        {
            Received r = Next(ms);
            Assert.AreEqual(op, r.Op, "expected " + op + ", got " + r.Op + " id " + r.Id);
            return r;
        }

        /// <summary>The next request within the time, or null.</summary>
        internal Received Poll(int ms)
        {
            Received r;
            return Requests.TryTake(out r, ms) ? r : null;
        }

        internal Conn NextConnection(int ms = 5000)
        {
            Conn c;
            if (!Connections.TryTake(out c, ms))
            {
                Assert.Fail("no connection within " + ms + " ms");
            }
            return c;
        }

        private void AcceptLoop()
        {
            while (true)
            {
                Socket s;
                try
                {
                    s = _listener.AcceptSocket();
                }
                catch (Exception)
                {
                    return;
                }
                int i = Interlocked.Increment(ref _index) - 1;
                new Thread(() => Serve(s, i)) { IsBackground = true, Name = "fake-server-conn-" + i }.Start();
            }
        }

        private static byte[] ReadExactly(Stream s, int n)
        {
            byte[] b = new byte[n];
            int at = 0;
            while (at < n)
            {
                int got = s.Read(b, at, n - at);
                if (got <= 0)
                {
                    throw new EndOfStreamException();
                }
                at += got;
            }
            return b;
        }

        private void Serve(Socket s, int index)
        {
            try
            {
                s.NoDelay = true;
                var stream = new NetworkStream(s, true);
                HelloFrame h = HelloFrame.Decode(ReadExactly(stream, Wire.Hello));
                string sid = BitConverter.ToString(h.SessionId).Replace("-", "").ToLowerInvariant();
                Hellos.Enqueue(sid);
                if (Frozen)
                {
                    while (stream.Read(new byte[256], 0, 256) > 0)
                    {
                        // never answer
                    }
                    return;
                }
                int refusal = Refuse;
                if (refusal >= 0)
                {
                    byte[] ch = new ChallengeFrame((Status)refusal, 1, 0, 0, null, null).Encode();
                    stream.Write(ch, 0, ch.Length);
                    stream.Flush();
                    Thread.Sleep(50);
                    return;
                }
                string hint = TakeNotLeaderNext() ? "" : NotLeaderHint;
                if (hint != null)
                {
                    byte[] data = Encoding.UTF8.GetBytes(hint);
                    byte[] ch = new ChallengeFrame(Status.NotLeader, 1, 0, 0, null, data).Encode();
                    stream.Write(ch, 0, ch.Length);
                    stream.Flush();
                    Thread.Sleep(50);
                    return;
                }
                byte[] nonce = new byte[32];
                byte[] tok = Token;
                if (tok != null)
                {
                    _rng.GetBytes(nonce);
                }
                byte[] chb = new ChallengeFrame(Status.Ok, 1, (byte)(tok != null ? 1 : 0), 0, nonce, null).Encode();
                stream.Write(chb, 0, chb.Length);
                byte[] proof = AuthFrame.Decode(ReadExactly(stream, Wire.Auth)).ClientProof;
                if (tok != null && !proof.SequenceEqual(Handshake.ClientProof(tok, h.SessionId, h.ClientNonce, nonce)))
                {
                    byte[] wf = new WelcomeFrame(Status.AuthFailed, 0, 0, 0, null, null).Encode();
                    stream.Write(wf, 0, wf.Length);
                    Thread.Sleep(50);
                    return;
                }
                bool resumed;
                HashSet<string> sessions = Sessions;
                lock (sessions)
                {
                    resumed = !sessions.Add(sid) && Resume;
                }
                byte flags = (byte)(resumed ? 1 : 0);
                var w0 = new WelcomeFrame(Status.Ok, flags, 0, GraceMs, StateId, null);
                byte[] sp = tok == null ? new byte[32] : Handshake.ServerProof(tok, h.SessionId, h.ClientNonce, nonce, w0.ProofInput());
                if (ForgeServerProof)
                {
                    sp[0] ^= 1;
                }
                byte[] wb = new WelcomeFrame(Status.Ok, flags, 0, GraceMs, StateId, sp).Encode();
                Thread.Sleep(WelcomeDelayMs);
                stream.Write(wb, 0, wb.Length);
                var c = new Conn(s, stream, index, h.SessionId, resumed);
                All.Enqueue(c);
                Connections.Add(c);
                while (true)
                {
                    byte[] len = ReadExactly(stream, 4);
                    int n = (len[0] << 24) | (len[1] << 16) | (len[2] << 8) | len[3];
                    byte[] frame = new byte[4 + n];
                    Buffer.BlockCopy(len, 0, frame, 0, 4);
                    Buffer.BlockCopy(ReadExactly(stream, n), 0, frame, 4, n);
                    RequestFrame f = RequestFrame.Decode(frame, 0, frame.Length, Wire.MaxKeyLen);
                    if (Frozen)
                    {
                        continue;
                    }
                    if (AutoPing && (f.Op == Op.Ping || f.Op == Op.Ack))
                    {
                        c.Ok(f);
                        continue;
                    }
                    Requests.Add(new Received { Conn = c, Frame = f });
                }
            }
            catch (Exception)
            {
                // connection over
            }
            finally
            {
                try
                {
                    s.Close();
                }
                catch (Exception)
                {
                    // gone
                }
            }
        }

        /// <summary>Kills every connection (RST).</summary>
        internal void KillAll()
        {
            foreach (Conn c in All.ToArray())
            {
                c.Kill();
            }
        }

        public void Dispose()
        {
            _listener.Stop();
            KillAll();
        }
    }

    /// <summary>A TCP proxy the test controls: it can cut every connection (RST both ways).</summary>
    internal sealed class Proxy : IDisposable
    {
        private readonly TcpListener _listener;
        private readonly string _targetHost;
        private readonly int _targetPort;
        private readonly List<Socket[]> _pairs = new List<Socket[]>();
        private int _accepted;

        internal Proxy(string target)
        {
            int colon = target.LastIndexOf(':');
            _targetHost = target.Substring(0, colon);
            _targetPort = int.Parse(target.Substring(colon + 1));
            _listener = new TcpListener(IPAddress.Loopback, 0);
            _listener.Start();
            new Thread(AcceptLoop) { IsBackground = true, Name = "proxy-accept" }.Start();
        }

        internal string Endpoint => "127.0.0.1:" + ((IPEndPoint)_listener.LocalEndpoint).Port;

        /// <summary>Connections accepted so far.</summary>
        internal int Accepted => Volatile.Read(ref _accepted);

        private void AcceptLoop()
        {
            while (true)
            {
                Socket client;
                try
                {
                    client = _listener.AcceptSocket();
                }
                catch (Exception)
                {
                    return;
                }
                var server = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
                try
                {
                    server.Connect(_targetHost, _targetPort);
                }
                catch (Exception)
                {
                    client.Close();
                    continue;
                }
                lock (_pairs)
                {
                    _pairs.Add(new[] { client, server });
                }
                Interlocked.Increment(ref _accepted);
                Pump(client, server);
                Pump(server, client);
            }
        }

        private static void Pump(Socket from, Socket to)
        {
            new Thread(() =>
            {
                byte[] buf = new byte[16384];
                try
                {
                    while (true)
                    {
                        int n = from.Receive(buf);
                        if (n <= 0)
                        {
                            break;
                        }
                        to.Send(buf, 0, n, SocketFlags.None);
                    }
                    to.Shutdown(SocketShutdown.Send);
                }
                catch (Exception)
                {
                    // cut
                }
            }) { IsBackground = true, Name = "proxy-pump" }.Start();
        }

        /// <summary>Resets every connection, both ways.</summary>
        internal void CutAll()
        {
            List<Socket[]> pairs;
            lock (_pairs)
            {
                pairs = new List<Socket[]>(_pairs);
                _pairs.Clear();
            }
            foreach (Socket[] p in pairs)
            {
                foreach (Socket s in p)
                {
                    try
                    {
                        s.LingerState = new LingerOption(true, 0);
                        s.Close();
                    }
                    catch (Exception)
                    {
                        // gone
                    }
                }
            }
        }

        public void Dispose()
        {
            _listener.Stop();
            CutAll();
        }
    }
}
