package io.hl7gw.fhir;

import ca.uhn.fhir.rest.annotation.Operation;
import ca.uhn.fhir.rest.annotation.OperationParam;
import ca.uhn.fhir.rest.annotation.Transaction;
import ca.uhn.fhir.rest.annotation.TransactionParam;
import org.hl7.fhir.r4.model.Bundle;

/** The server's base: transaction/batch Bundles (POST /fhir) and $process-message. */
public final class SystemProvider {
    private final Store store;

    SystemProvider(Store store) {
        this.store = store;
    }

    @Transaction
    public Bundle transaction(@TransactionParam Bundle bundle) {
        return store.transaction(bundle);
    }

    @Operation(name = "$process-message")
    public Bundle processMessage(@OperationParam(name = "content") Bundle message) {
        return store.processMessage(message);
    }
}
