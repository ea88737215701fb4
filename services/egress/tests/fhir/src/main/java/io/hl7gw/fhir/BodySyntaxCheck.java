package io.hl7gw.fhir;

import ca.uhn.fhir.interceptor.api.Hook;
import ca.uhn.fhir.interceptor.api.Pointcut;
import ca.uhn.fhir.rest.api.server.RequestDetails;
import ca.uhn.fhir.rest.server.exceptions.InvalidRequestException;
import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;

/**
 * Before the RequestValidatingInterceptor: a JSON body that is not JSON at all is a 400 here. HAPI's validator
 * throws on it, and the interceptor turns any exception of the validator into a 500.
 */
public final class BodySyntaxCheck {
    private final ObjectMapper json = new ObjectMapper();

    @Hook(value = Pointcut.SERVER_INCOMING_REQUEST_POST_PROCESSED, order = -100)
    public boolean check(RequestDetails request) {
        String method = request.getRequestType() == null ? "" : request.getRequestType().name();
        if (!method.equals("POST") && !method.equals("PUT")) {
            return true;
        }
        String type = request.getHeader("Content-Type");
        if (type != null && type.contains("xml")) {
            return true;
        }
        byte[] body = request.loadRequestContents();
        if (body == null || body.length == 0) {
            return true;
        }
        try {
            json.readTree(body);
        } catch (JsonProcessingException e) {
            throw new InvalidRequestException("The request body is not valid JSON: " + e.getOriginalMessage()
                    + " (line " + e.getLocation().getLineNr() + ", column " + e.getLocation().getColumnNr() + ")");
        } catch (IOException e) {
            throw new InvalidRequestException("The request body could not be read: " + e.getMessage());
        }
        return true;
    }
}
