"""The controller: cluster metadata, partition leadership, ISR and broker liveness.

Any number of processes run; one is active (elected through the consensus store), the
others stand by. State lives in the store and every write is fenced by the controller epoch.
"""
