package io.hl7gw.hapi;

import ca.uhn.hl7v2.DefaultHapiContext;
import ca.uhn.hl7v2.HapiContext;
import ca.uhn.hl7v2.app.Connection;
import ca.uhn.hl7v2.app.Initiator;
import ca.uhn.hl7v2.llp.HL7Reader;
import ca.uhn.hl7v2.llp.HL7Writer;
import ca.uhn.hl7v2.llp.MinLowerLayerProtocol;
import ca.uhn.hl7v2.model.Message;
import ca.uhn.hl7v2.parser.PipeParser;
import ca.uhn.hl7v2.util.Terser;
import ca.uhn.hl7v2.validation.impl.ValidationContextFactory;
import java.net.Socket;
import java.util.concurrent.TimeUnit;

/**
 * What a sender built on HAPI v2 sees of the ingress's answers. One line per event on stdout, tab-separated:
 *
 * <pre>
 * initiator HOST PORT TIMEOUT_MS CONTROL_ID MSH15 MSH16
 *     HAPI's client (HapiContext.newClient, MinLowerLayerProtocol, Initiator.sendAndReceive):
 *     ANSWER  MSA-1  MSA-2  MSH-10  elapsed-ms        the message HAPI's Initiator returned
 *     NOANSWER  elapsed-ms  exception                 it gave up (its timeout)
 * reader HOST PORT TIMEOUT_MS CONTROL_ID MSH15 MSH16 SENDS
 *     HAPI's MLLP writer and reader (MinLowerLayerProtocol) on a plain socket: the message sent SENDS times
 *     (a resend is the same bytes), then every message read until TIMEOUT_MS of silence, each parsed by HAPI:
 *     MESSAGE  MSH-9  MSA-1  MSA-2  MSH-10  MSH-15  MSH-16   (empty values as -)
 *     END                                             nothing more (HAPI's reader returns no message on
 *                                                     its socket timeout as on a close)
 * </pre>
 *
 * "-" stands for an empty MSH-15/16 argument.
 */
public final class HapiProbe {
    private HapiProbe() {}

    public static void main(String[] a) throws Exception {
        String mode = a[0], host = a[1];
        int port = Integer.parseInt(a[2]);
        int timeoutMs = Integer.parseInt(a[3]);
        String id = a[4], msh15 = dash(a[5]), msh16 = dash(a[6]);
        try (HapiContext ctx = new DefaultHapiContext()) {
            ctx.setValidationContext(ValidationContextFactory.noValidation());
            ctx.setLowerLayerProtocol(new MinLowerLayerProtocol());
            PipeParser parser = ctx.getPipeParser();
            Message msg = parser.parse(adt(id, msh15, msh16));
            switch (mode) {
                case "initiator" -> initiator(ctx, msg, host, port, timeoutMs);
                case "reader" -> reader(parser, msg, host, port, timeoutMs, Integer.parseInt(a[7]));
                default -> throw new IllegalArgumentException("mode " + mode);
            }
        }
        System.out.flush();
        // HAPI's executor threads are not daemons.
        System.exit(0);
    }

    private static String dash(String v) {
        return v.equals("-") ? "" : v;
    }

    private static String adt(String id, String msh15, String msh16) {
        return "MSH|^~\\&|HAPIAPP|HAPIFAC|HL7GW|HL7GW|20261122120000||ADT^A01^ADT_A01|" + id + "|P|2.5.1|||"
                + msh15 + "|" + msh16 + "\r"
                + "EVN|A01|20261122120000\r"
                + "PID|1||P1^^^HAPIFAC^MR||DOE^JANE||19700101|F\r";
    }

    private static void initiator(HapiContext ctx, Message msg, String host, int port, int timeoutMs)
            throws Exception {
        Connection conn = ctx.newClient(host, port, false);
        try {
            Initiator init = conn.getInitiator();
            init.setTimeout(timeoutMs, TimeUnit.MILLISECONDS);
            long t0 = System.nanoTime();
            try {
                Message r = init.sendAndReceive(msg);
                Terser t = new Terser(r);
                out("ANSWER", t.get("/MSA-1"), t.get("/MSA-2"), t.get("/MSH-10"), ms(t0));
            } catch (Exception e) {
                out("NOANSWER", ms(t0), e.getClass().getSimpleName() + ": " + e.getMessage());
            }
        } finally {
            conn.close();
        }
    }

    private static void reader(PipeParser parser, Message msg, String host, int port, int timeoutMs, int sends)
            throws Exception {
        try (Socket s = new Socket(host, port)) {
            s.setSoTimeout(timeoutMs);
            MinLowerLayerProtocol llp = new MinLowerLayerProtocol();
            HL7Writer w = llp.getWriter(s.getOutputStream());
            HL7Reader r = llp.getReader(s.getInputStream());
            String text = parser.encode(msg);
            for (int i = 0; i < sends; i++) {
                w.writeMessage(text);
            }
            for (int i = 0; i < 64; i++) {
                String m;
                try {
                    m = r.getMessage();
                } catch (Exception e) {
                    out("END", e.getClass().getSimpleName());
                    return;
                }
                if (m == null) {
                    out("END");
                    return;
                }
                Terser t = new Terser(parser.parse(m));
                out("MESSAGE", t.get("/MSH-9-1") + "^" + t.get("/MSH-9-2"), t.get("/MSA-1"), t.get("/MSA-2"),
                        t.get("/MSH-10"), t.get("/MSH-15"), t.get("/MSH-16"));
            }
        }
    }

    private static String ms(long t0) {
        return Long.toString((System.nanoTime() - t0) / 1_000_000);
    }

    private static void out(String... fields) {
        StringBuilder b = new StringBuilder();
        for (String f : fields) {
            if (b.length() > 0) {
                b.append('\t');
            }
            b.append(f == null || f.isEmpty() ? "-" : f);
        }
        System.out.println(b);
    }
}
