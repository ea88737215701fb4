package io.hl7gw.fhir;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.PublicKey;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.cert.X509Certificate;
import java.security.spec.PKCS8EncodedKeySpec;
import java.security.spec.X509EncodedKeySpec;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.naming.ldap.LdapName;
import javax.naming.ldap.Rdn;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

/** PEM files read with the JDK alone (certificates, PKCS#8 private keys, SPKI public keys) and the server's SSLContext. */
final class Tls {
    private Tls() {}

    private static final Pattern PEM = Pattern.compile("-----BEGIN ([A-Z0-9 ]+)-----(.*?)-----END \\1-----", Pattern.DOTALL);
    private static final char[] NO_PASSWORD = "harness".toCharArray();

    /** The DER bodies of the file's PEM blocks of that type (e.g. "CERTIFICATE"), in order. */
    static List<byte[]> blocks(Path file, String type) throws IOException {
        String text = Files.readString(file, StandardCharsets.US_ASCII);
        List<byte[]> out = new ArrayList<>();
        Matcher m = PEM.matcher(text);
        List<String> seen = new ArrayList<>();
        while (m.find()) {
            seen.add(m.group(1));
            if (m.group(1).equals(type)) {
                out.add(Base64.getMimeDecoder().decode(m.group(2).trim()));
            }
        }
        if (out.isEmpty()) {
            throw new IOException(file + ": no PEM block '" + type + "' (found: " + seen + ")"
                    + (type.equals("PRIVATE KEY") && !seen.isEmpty()
                            ? "; convert with `openssl pkcs8 -topk8 -nocrypt -in KEY -out KEY.pk8`" : ""));
        }
        return out;
    }

    static X509Certificate[] certificates(Path file) throws IOException, GeneralSecurityException {
        CertificateFactory cf = CertificateFactory.getInstance("X.509");
        List<X509Certificate> out = new ArrayList<>();
        for (byte[] der : blocks(file, "CERTIFICATE")) {
            out.add((X509Certificate) cf.generateCertificate(new ByteArrayInputStream(der)));
        }
        return out.toArray(new X509Certificate[0]);
    }

    /** A PKCS#8 ("PRIVATE KEY") RSA, EC, Ed25519 or Ed448 key. */
    static PrivateKey privateKey(Path file) throws IOException, GeneralSecurityException {
        byte[] der = blocks(file, "PRIVATE KEY").get(0);
        for (String alg : List.of("EC", "RSA", "Ed25519", "Ed448", "RSASSA-PSS")) {
            try {
                return KeyFactory.getInstance(alg).generatePrivate(new PKCS8EncodedKeySpec(der));
            } catch (GeneralSecurityException e) {
                // the next algorithm
            }
        }
        throw new GeneralSecurityException(file + ": a PKCS#8 key that is neither RSA, EC nor EdDSA");
    }

    /** An SPKI ("PUBLIC KEY") RSA or EC key, or the key of the first certificate of a "CERTIFICATE" PEM. */
    static PublicKey publicKey(Path file) throws IOException, GeneralSecurityException {
        if (Files.readString(file, StandardCharsets.US_ASCII).contains("-----BEGIN CERTIFICATE-----")) {
            return certificates(file)[0].getPublicKey();
        }
        byte[] der = blocks(file, "PUBLIC KEY").get(0);
        for (String alg : List.of("RSA", "EC")) {
            try {
                return KeyFactory.getInstance(alg).generatePublic(new X509EncodedKeySpec(der));
            } catch (GeneralSecurityException e) {
                // the next algorithm
            }
        }
        throw new GeneralSecurityException(file + ": a public key that is neither RSA nor EC");
    }

    /** The server's context: its chain and key, and (mutual TLS) the CA that client certificates must chain to. */
    static SSLContext context(Path certFile, Path keyFile, Path clientCaFile) throws IOException, GeneralSecurityException {
        X509Certificate[] chain = certificates(certFile);
        PrivateKey key = privateKey(keyFile);
        KeyStore ks = KeyStore.getInstance("PKCS12");
        ks.load(null, null);
        ks.setKeyEntry("server", key, NO_PASSWORD, chain);
        KeyManagerFactory kmf = KeyManagerFactory.getInstance("PKIX");
        kmf.init(ks, NO_PASSWORD);
        TrustManagerFactory tmf = null;
        if (clientCaFile != null) {
            KeyStore trust = KeyStore.getInstance("PKCS12");
            trust.load(null, null);
            int i = 0;
            for (X509Certificate ca : certificates(clientCaFile)) {
                trust.setCertificateEntry("client-ca-" + i++, ca);
            }
            tmf = TrustManagerFactory.getInstance("PKIX");
            tmf.init(trust);
        }
        SSLContext ctx = SSLContext.getInstance("TLS");
        ctx.init(kmf.getKeyManagers(), tmf == null ? null : tmf.getTrustManagers(), null);
        return ctx;
    }

    /** The subject's CN (the whole subject when it has none). */
    static String cn(Certificate cert) {
        if (!(cert instanceof X509Certificate x)) {
            return null;
        }
        String dn = x.getSubjectX500Principal().getName();
        try {
            for (Rdn rdn : new LdapName(dn).getRdns()) {
                if (rdn.getType().equalsIgnoreCase("CN")) {
                    return rdn.getValue().toString();
                }
            }
        } catch (javax.naming.InvalidNameException e) {
            // the whole DN below
        }
        return dn;
    }
}
