using System;
using System.IO;
using System.Net;
using System.Net.Security;
using System.Net.Sockets;
using System.Security.Authentication;
using System.Security.Cryptography;
using System.Security.Cryptography.X509Certificates;
using System.Threading;
using System.Threading.Tasks;
using Ticketing.Protocol;

namespace Ticketing
{
    /// <summary>Opens one connection: TCP, TLS when configured, and the four-frame handshake.</summary>
    internal static class Dialer
    {
        /// <summary>A connection whose handshake succeeded.</summary>
        internal sealed class Dialed
        {
            internal Endpoint Endpoint;
            internal Socket Socket;
            internal Stream Stream;
            internal FrameReader Reader;
            internal WelcomeFrame Welcome;

            internal void Close()
            {
                Abort(Socket, Stream);
            }
        }

        /// <summary>A <c>CHALLENGE</c> <c>NOT_LEADER</c>: the endpoint names the leader (or nobody).</summary>
        internal sealed class NotLeaderException : TicketingException
        {
            internal NotLeaderException(Endpoint endpoint, string leader)
                : base(endpoint + " is not the leader" + (leader == null ? " and knows none" : "; the leader is " + leader))
            {
                Leader = leader;
            }

            internal string Leader { get; }
        }

        private enum Stage
        {
            Connect,
            Tls,
            Handshake,
            Session, // a CHALLENGE came: the server took the TLS session
        }

        /// <summary>Closes a socket and its stream, ignoring errors; aborts pending I/O.</summary>
        internal static void Abort(Socket socket, Stream stream)
        {
            try
            {
                socket?.Dispose();
            }
            catch (Exception)
            {
                // closing anyway
            }
            try
            {
                stream?.Dispose();
            }
            catch (Exception)
            {
                // closing anyway
            }
        }

        /// <summary>How long TLS and the protocol handshake may take once TCP is connected (docs/clients.md, the connect timeout).</summary>
        internal const double HandshakeWaitMs = 2000;

        /// <summary>Connects to one endpoint within the connect timeout; <paramref name="closing"/> aborts it.</summary>
        internal static async Task<Dialed> DialAsync(Endpoint ep, Settings s, byte[] sessionId, RandomNumberGenerator rng, CancellationToken closing)
        {
            Socket socket = null;
            Stream stream = null;
            var stage = Stage.Connect;
            bool ok = false;
            using (var deadline = new CancellationTokenSource())
            using (var abort = CancellationTokenSource.CreateLinkedTokenSource(deadline.Token, closing))
            using (abort.Token.Register(() => Abort(Volatile.Read(ref socket), Volatile.Read(ref stream))))
            {
                long started = Clock.Now;
                double boundMs = s.ConnectTimeout.TotalMilliseconds;
                string boundFrom = "";
                TimerEntry timeout = TimerQueue.Shared.CancelAfter(deadline, s.ConnectTimeout);
                try
                {
                    IPAddress[] addresses = await ResolveAsync(ep, abort.Token).ConfigureAwait(false);
                    Exception last = null;
                    foreach (IPAddress a in addresses)
                    {
                        var sock = new Socket(a.AddressFamily, SocketType.Stream, ProtocolType.Tcp) { NoDelay = true };
                        Volatile.Write(ref socket, sock);
                        if (abort.IsCancellationRequested)
                        {
                            sock.Dispose();
                            break;
                        }
                        try
                        {
                            await sock.ConnectAsync(a, ep.Port).ConfigureAwait(false);
                            last = null;
                            break;
                        }
                        catch (SocketException e)
                        {
                            last = e;
                            sock.Dispose();
                        }
                    }
                    abort.Token.ThrowIfCancellationRequested();
                    if (last != null)
                    {
                        throw new UnavailableException("cannot connect to " + ep + ": " + last.Message, last);
                    }
                    // TLS and the handshake get at most HandshakeWaitMs once TCP is connected: a
                    // frozen node's kernel still accepts connections, and the next endpoint should
                    // not wait for the whole connect timeout behind it.
                    double left = s.ConnectTimeout.TotalMilliseconds - Clock.ToMs(Clock.Now - started);
                    if (HandshakeWaitMs < left)
                    {
                        timeout.Dispose();
                        boundMs = HandshakeWaitMs;
                        boundFrom = " of the TCP connection";
                        timeout = TimerQueue.Shared.CancelAfter(deadline, TimeSpan.FromMilliseconds(HandshakeWaitMs));
                    }
                    socket.SetSocketOption(SocketOptionLevel.Socket, SocketOptionName.KeepAlive, true);
                    Volatile.Write(ref stream, new NetworkStream(socket, true));
                    if (s.Tls != null)
                    {
                        stage = Stage.Tls;
                        Stream secured = await StartTlsAsync(stream, ep, s.Tls).ConfigureAwait(false);
                        Volatile.Write(ref stream, secured);
                    }
                    stage = Stage.Handshake;
                    Dialed d = await HandshakeAsync(ep, stream, s, sessionId, rng, () => stage = Stage.Session).ConfigureAwait(false);
                    d.Socket = socket;
                    ok = true;
                    return d;
                }
                catch (Exception e) when (closing.IsCancellationRequested && !(e is ClosedException))
                {
                    throw new ClosedException("the client was closed while connecting to " + ep);
                }
                catch (Exception e) when (deadline.IsCancellationRequested
                    && !(e is AuthFailedException || e is UnsupportedVersionException || e is NotLeaderException))
                {
                    long ms = (long)boundMs;
                    switch (stage)
                    {
                        case Stage.Connect:
                            throw new UnavailableException("connect to " + ep + " timed out after " + ms + " ms");
                        case Stage.Tls:
                            throw new TlsException("TLS handshake with " + ep + " timed out: no answer within " + ms + " ms" + boundFrom
                                + " (is the server using TLS, or frozen?)");
                        default:
                            throw new UnavailableException("handshake with " + ep + " timed out: no answer within " + ms + " ms" + boundFrom
                                + (s.Tls == null ? " (is the server frozen, or using TLS?)" : " (is the server frozen?)"));
                    }
                }
                catch (TicketingException)
                {
                    throw;
                }
                catch (Exception e) when (stage == Stage.Connect)
                {
                    throw new UnavailableException("cannot connect to " + ep + ": " + e.Message, e);
                }
                catch (Exception e) when (stage == Stage.Tls)
                {
                    throw new TlsException("TLS handshake with " + ep + " failed: " + Describe(e)
                        + " (is the server using TLS, does it trust this client, and is its certificate trusted?)", e);
                }
                catch (Exception e) when (s.Tls != null && stage != Stage.Session)
                {
                    throw new TlsException("the TLS connection to " + ep + " failed during the handshake: " + Describe(e)
                        + " (does the server require a client certificate?)", e);
                }
                catch (Exception e)
                {
                    throw new UnavailableException("handshake with " + ep + " failed: " + e.Message, e);
                }
                finally
                {
                    timeout.Dispose();
                    if (!ok)
                    {
                        Abort(Volatile.Read(ref socket), Volatile.Read(ref stream));
                    }
                }
            }
        }

        private static string Describe(Exception e)
        {
            string m = e.Message;
            for (Exception i = e.InnerException; i != null; i = i.InnerException)
            {
                m += ": " + i.Message;
            }
            return m;
        }

        private static async Task<IPAddress[]> ResolveAsync(Endpoint ep, CancellationToken ct)
        {
            IPAddress ip;
            string host = ep.Host;
            if (IPAddress.TryParse(host, out ip))
            {
                return new[] { ip };
            }
            Task<IPAddress[]> lookup = Dns.GetHostAddressesAsync(host);
            var cancelled = new TaskCompletionSource<bool>();
            using (ct.Register(() => cancelled.TrySetResult(true)))
            {
                if (await Task.WhenAny(lookup, cancelled.Task).ConfigureAwait(false) != lookup)
                {
                    throw new OperationCanceledException(ct);
                }
            }
            try
            {
                IPAddress[] all = await lookup.ConfigureAwait(false);
                if (all.Length == 0)
                {
                    throw new UnavailableException("cannot resolve " + ep + ": no address");
                }
                return all;
            }
            catch (SocketException e)
            {
                throw new UnavailableException("cannot resolve " + ep + ": " + e.Message, e);
            }
        }

        private static async Task<Stream> StartTlsAsync(Stream inner, Endpoint ep, TlsOptions tls)
        {
            string name = tls.ServerName ?? ep.Host;
            var clientCerts = new X509CertificateCollection();
            if (tls.ClientCertificate != null)
            {
                clientCerts.Add(tls.ClientCertificate);
            }
            string rejected = null;
#if MONO
            // Mono's managed X509Chain cannot read ECDSA keys; its BoringSSL provider can, given
            // the authorities as trust anchors, and then reports the verdict to this callback.
            var settings = Mono.Security.Interface.MonoTlsSettings.CopyDefaultSettings();
            if (tls.TrustedCertificates != null && tls.TrustedCertificates.Count > 0)
            {
                settings.TrustAnchors = new X509CertificateCollection(tls.TrustedCertificates);
            }
            settings.CheckCertificateRevocationStatus = tls.CheckCertificateRevocation;
            IPAddress ip;
            bool byAddress = IPAddress.TryParse(name, out ip);
            settings.RemoteCertificateValidationCallback = (host, cert, chain, errors) =>
            {
                if (errors == Mono.Security.Interface.MonoSslPolicyErrors.None)
                {
                    return true;
                }
                // BoringSSL's name check matches DNS names only; an IP address is matched here
                // against the certificate's iPAddress entries (the chain itself verified).
                if (errors == Mono.Security.Interface.MonoSslPolicyErrors.RemoteCertificateNameMismatch && byAddress && SanHasAddress(cert, ip))
                {
                    return true;
                }
                rejected = errors.ToString();
                return false;
            };
            settings.ClientCertificateSelectionCallback = (host, local, remote, issuers) => local.Count > 0 ? local[0] : null;
            var provider = Mono.Security.Interface.MonoTlsProviderFactory.GetProvider();
            var mono = provider.CreateSslStream(inner, false, settings);
            try
            {
                await mono.AuthenticateAsClientAsync(name, clientCerts, SslProtocols.Tls12, tls.CheckCertificateRevocation).ConfigureAwait(false);
            }
            catch (Exception e) when (rejected != null)
            {
                throw new TlsException("TLS handshake with " + ep + " failed: the server's certificate was rejected (" + rejected + ") for \"" + name + "\"", e);
            }
            return mono.SslStream;
#else
            var ssl = new SslStream(inner, false,
                (sender, cert, chain, errors) =>
                {
                    string why = Verify(cert, errors, tls);
                    rejected = why;
                    return why == null;
                },
                (sender, host, local, remote, issuers) => local.Count > 0 ? local[0] : null);
            try
            {
                await ssl.AuthenticateAsClientAsync(name, clientCerts, SslProtocols.None, tls.CheckCertificateRevocation).ConfigureAwait(false);
            }
            catch (Exception e) when (rejected != null)
            {
                throw new TlsException("TLS handshake with " + ep + " failed: the server's certificate was rejected (" + rejected + ") for \"" + name + "\"", e);
            }
            return ssl;
#endif
        }

#if MONO
        /// <summary>Tells whether the certificate's subjectAltName lists this IP address.</summary>
        private static bool SanHasAddress(X509Certificate cert, IPAddress ip)
        {
            try
            {
                var c2 = cert as X509Certificate2 ?? new X509Certificate2(cert);
                byte[] want = ip.GetAddressBytes();
                foreach (X509Extension ext in c2.Extensions)
                {
                    if (ext.Oid == null || ext.Oid.Value != "2.5.29.17")
                    {
                        continue;
                    }
                    var names = new Der.Reader(new Der.Reader(ext.RawData).Read(0x30));
                    while (names.HasMore)
                    {
                        byte tag = names.PeekTag();
                        byte[] value = names.Read(tag);
                        if (tag == 0x87 && value.Length == want.Length && Handshake.ProofsEqual(value, want))
                        {
                            return true;
                        }
                    }
                }
            }
            catch (Exception e) when (e is ArgumentException || e is CryptographicException)
            {
                return false;
            }
            return false;
        }
#endif

#if !MONO
        /// <summary>Checks the server certificate; returns why it is rejected, or null.</summary>
        private static string Verify(X509Certificate cert, SslPolicyErrors errors, TlsOptions tls)
        {
            if ((errors & ~SslPolicyErrors.RemoteCertificateChainErrors) != 0)
            {
                return errors.ToString();
            }
            X509Certificate2Collection anchors = tls.TrustedCertificates;
            if (anchors == null || anchors.Count == 0)
            {
                return errors == SslPolicyErrors.None ? null : errors.ToString();
            }
            if (cert == null)
            {
                return "no certificate";
            }
            using (var chain = new X509Chain())
            {
                chain.ChainPolicy.RevocationMode = tls.CheckCertificateRevocation ? X509RevocationMode.Online : X509RevocationMode.NoCheck;
                chain.ChainPolicy.VerificationFlags = X509VerificationFlags.AllowUnknownCertificateAuthority;
                chain.ChainPolicy.ExtraStore.AddRange(anchors);
                var leaf = cert as X509Certificate2 ?? new X509Certificate2(cert);
                chain.Build(leaf);
                foreach (X509ChainStatus st in chain.ChainStatus)
                {
                    if (st.Status != X509ChainStatusFlags.UntrustedRoot && st.Status != X509ChainStatusFlags.NoError)
                    {
                        return "chain: " + st.Status;
                    }
                }
                X509Certificate2 root = chain.ChainElements[chain.ChainElements.Count - 1].Certificate;
                foreach (X509Certificate2 a in anchors)
                {
                    if (a.RawData.Length == root.RawData.Length && Handshake.ProofsEqual(a.RawData, root.RawData))
                    {
                        return null;
                    }
                }
                return "it does not chain to a trusted certificate";
            }
        }
#endif

        private static async Task<Dialed> HandshakeAsync(Endpoint ep, Stream stream, Settings s, byte[] sessionId, RandomNumberGenerator rng,
            Action challenged)
        {
            bool tls = s.Tls != null;
            var reader = new FrameReader(stream);
            byte[] clientNonce = new byte[Wire.Nonce];
            rng.GetBytes(clientNonce);
            byte[] hello = new HelloFrame(Wire.Version, 0, sessionId, clientNonce).Encode();
            await stream.WriteAsync(hello, 0, hello.Length).ConfigureAwait(false);
            await stream.FlushAsync().ConfigureAwait(false);

            byte[] head = await reader.PeekAsync(4).ConfigureAwait(false);
            if (head == null)
            {
                throw Closed(ep, tls);
            }
            if (!tls && (head[0] == 0x15 || head[0] == 0x16))
            {
                throw new TlsException("the server at " + ep + " answered with TLS; is the server using TLS? (set TicketingOptions.Tls)");
            }
            uint len = BigEndian.ReadUInt32(head, 0);
            try
            {
                ChallengeFrame.CheckLength(len);
            }
            catch (FrameException e)
            {
                throw new ProtocolException("malformed CHALLENGE from " + ep + ": " + e.Message + (tls ? "" : " (is the server using TLS?)"), e);
            }
            byte[] frame = await reader.ReadExactAsync((int)len + 4).ConfigureAwait(false);
            if (frame == null)
            {
                throw Closed(ep, tls);
            }
            ChallengeFrame ch;
            try
            {
                ch = ChallengeFrame.Decode(frame);
            }
            catch (FrameException e)
            {
                throw new ProtocolException("malformed CHALLENGE from " + ep + ": " + e.Message, e);
            }
            challenged();
            if (ch.Status != Status.Ok)
            {
                throw ChallengeError(ep, ch);
            }
            byte[] token = s.Token;
            if (token != null && !ch.AuthRequired)
            {
                throw new AuthFailedException("the server at " + ep + " does not require a token, but this client has one: refusing it (it cannot prove it holds the token)");
            }
            byte[] proof = token != null ? Handshake.ClientProof(token, sessionId, clientNonce, ch.ServerNonce) : new byte[Wire.Proof];
            byte[] auth = new AuthFrame(proof).Encode();
            await stream.WriteAsync(auth, 0, auth.Length).ConfigureAwait(false);
            await stream.FlushAsync().ConfigureAwait(false);

            byte[] wb = await reader.ReadExactAsync(Wire.Welcome).ConfigureAwait(false);
            if (wb == null)
            {
                throw new UnavailableException("connection to " + ep + " closed during the handshake");
            }
            WelcomeFrame w;
            try
            {
                w = WelcomeFrame.Decode(wb);
            }
            catch (FrameException e)
            {
                throw new ProtocolException("malformed WELCOME from " + ep + ": " + e.Message, e);
            }
            if (w.Status != Status.Ok)
            {
                throw WelcomeError(ep, w, token != null);
            }
            if (token != null)
            {
                byte[] expected = Handshake.ServerProof(token, sessionId, clientNonce, ch.ServerNonce, w.ProofInput());
                if (!Handshake.ProofsEqual(expected, w.ServerProof))
                {
                    throw new AuthFailedException("the server at " + ep + " could not prove that it holds the token");
                }
            }
            return new Dialed { Endpoint = ep, Stream = stream, Reader = reader, Welcome = w };
        }

        private static TicketingException Closed(Endpoint ep, bool tls)
        {
            if (tls)
            {
                return new TlsException("the server at " + ep + " closed the TLS connection during the handshake (does it require a client certificate?)");
            }
            return new UnavailableException("connection to " + ep + " closed during the handshake (is the server using TLS?)");
        }

        private static TicketingException ChallengeError(Endpoint ep, ChallengeFrame ch)
        {
            string msg = Args.Utf8(ch.Data);
            string suffix = msg.Length == 0 ? "" : ": " + msg;
            switch (ch.Status)
            {
                case Status.NotLeader:
                    return new NotLeaderException(ep, msg.Length == 0 ? null : msg);
                case Status.UnsupportedVersion:
                    return new UnsupportedVersionException("the server at " + ep + " does not speak protocol version " + Wire.Version + " (it speaks " + ch.Version + ")" + suffix);
                case Status.Busy:
                    return new BusyException("the server at " + ep + " is busy (" + LimitName(ch.Detail) + ")" + suffix, (BusyLimit)ch.Detail);
                case Status.ShuttingDown:
                    return new ShuttingDownException("the server at " + ep + " is shutting down");
                case Status.Invalid:
                    return new ProtocolException("the server at " + ep + " rejected HELLO (" + FieldName(ch.Detail) + ")" + suffix);
                default:
                    return new ProtocolException("the server at " + ep + " refused the handshake with status " + StatusName(ch.Status) + suffix);
            }
        }

        private static TicketingException WelcomeError(Endpoint ep, WelcomeFrame w, bool hasToken)
        {
            switch (w.Status)
            {
                case Status.AuthFailed:
                    return new AuthFailedException(hasToken
                        ? "the server at " + ep + " rejected the token"
                        : "the server at " + ep + " requires a token; none is configured");
                case Status.Busy:
                    return new BusyException("the server at " + ep + " is busy (" + LimitName(w.Detail) + ")", (BusyLimit)w.Detail);
                case Status.ShuttingDown:
                    return new ShuttingDownException("the server at " + ep + " is shutting down");
                case Status.NotLeader:
                    return new NotLeaderException(ep, null);
                case Status.UnsupportedVersion:
                    return new UnsupportedVersionException("the server at " + ep + " does not speak protocol version " + Wire.Version);
                default:
                    return new ProtocolException("the server at " + ep + " refused the session with status " + StatusName(w.Status));
            }
        }

        internal static string LimitName(uint code)
        {
            return Enum.IsDefined(typeof(BusyLimit), code) ? Upper(((BusyLimit)code).ToString()) : "limit " + code;
        }

        internal static string FieldName(uint code)
        {
            return Enum.IsDefined(typeof(InvalidField), code) ? Upper(((InvalidField)code).ToString()) : "field " + code;
        }

        internal static string StatusName(Status s)
        {
            return Enum.IsDefined(typeof(Status), s) ? Upper(s.ToString()) : "status " + (int)s;
        }

        /// <summary>"WaitersPerKey" as the protocol writes it: "WAITERS_PER_KEY".</summary>
        internal static string Upper(string pascal)
        {
            var sb = new System.Text.StringBuilder();
            for (int i = 0; i < pascal.Length; i++)
            {
                if (i > 0 && char.IsUpper(pascal[i]))
                {
                    sb.Append('_');
                }
                sb.Append(char.ToUpperInvariant(pascal[i]));
            }
            return sb.ToString();
        }
    }
}
