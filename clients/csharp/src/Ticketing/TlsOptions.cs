using System;
using System.IO;
using System.Security.Cryptography.X509Certificates;

namespace Ticketing
{
    /// <summary>
    /// TLS settings: which certificate authorities to trust for the server, an optional client
    /// certificate (mutual TLS), and the name the server's certificate must carry.
    /// </summary>
    /// <example>
    /// <code>
    /// var tls = new TlsOptions
    /// {
    ///     TrustedCertificates = TlsOptions.LoadCertificates("ca.pem"),
    ///     ClientCertificate = TlsOptions.LoadClientCertificate("client.pem", "client.key"),
    ///     ServerName = "locks.internal",
    /// };
    /// </code>
    /// </example>
    public sealed class TlsOptions
    {
        /// <summary>
        /// The authorities the server's certificate must chain to; null or empty trusts the system's
        /// store. When set, only these are trusted. Default: null.
        /// </summary>
        public X509Certificate2Collection TrustedCertificates { get; set; }

        /// <summary>A client certificate with its private key, for servers that require one (mutual TLS). Default: null.</summary>
        public X509Certificate2 ClientCertificate { get; set; }

        /// <summary>The name the server's certificate must carry (and SNI); null uses the endpoint's host. Default: null.</summary>
        public string ServerName { get; set; }

        /// <summary>When true, the server certificate's revocation status is checked. Default: false.</summary>
        public bool CheckCertificateRevocation { get; set; }

        internal TlsOptions Copy()
        {
            var c = (TlsOptions)MemberwiseClone();
            c.TrustedCertificates = TrustedCertificates == null ? null : new X509Certificate2Collection(TrustedCertificates);
            return c;
        }

        /// <summary>Reads every certificate of a PEM file (a CA bundle).</summary>
        /// <param name="pemPath">the file</param>
        /// <returns>the certificates</returns>
        /// <exception cref="ArgumentException">the file holds no certificate</exception>
        /// <exception cref="IOException">the file cannot be read</exception>
        public static X509Certificate2Collection LoadCertificates(string pemPath)
        {
            var all = new X509Certificate2Collection();
            foreach (byte[] der in Pem.Blocks(File.ReadAllText(pemPath), "CERTIFICATE"))
            {
                all.Add(new X509Certificate2(der));
            }
            if (all.Count == 0)
            {
                throw new ArgumentException("no CERTIFICATE block in " + pemPath, nameof(pemPath));
            }
            return all;
        }

        /// <summary>
        /// Reads a client certificate and its private key from PEM files: the key as PKCS#8
        /// (<c>PRIVATE KEY</c>), SEC1 (<c>EC PRIVATE KEY</c>) or PKCS#1 (<c>RSA PRIVATE KEY</c>),
        /// unencrypted. A <c>.pfx</c> file loads with <c>new X509Certificate2(path, password)</c> instead.
        /// </summary>
        /// <param name="certPemPath">the certificate (the first <c>CERTIFICATE</c> block is used)</param>
        /// <param name="keyPemPath">the private key</param>
        /// <returns>the certificate with its private key</returns>
        /// <exception cref="ArgumentException">a file holds no certificate or no supported key</exception>
        /// <exception cref="IOException">a file cannot be read</exception>
        public static X509Certificate2 LoadClientCertificate(string certPemPath, string keyPemPath)
        {
            byte[] cert = null;
            foreach (byte[] der in Pem.Blocks(File.ReadAllText(certPemPath), "CERTIFICATE"))
            {
                cert = der;
                break;
            }
            if (cert == null)
            {
                throw new ArgumentException("no CERTIFICATE block in " + certPemPath, nameof(certPemPath));
            }
            byte[] pkcs8 = Pem.PrivateKey(File.ReadAllText(keyPemPath), keyPemPath);
            string password = Pem.RandomPassword();
            byte[] pfx = Pkcs12.Build(cert, pkcs8, password);
            return new X509Certificate2(pfx, password);
        }
    }
}
