# Peer for the moons training benchmark: the same MLP (2-16-16-1, relu), hinge loss, SGD with
# momentum 0.9 and weight decay 1e-4, batches of 20, 60 epochs over 400 points, in NumPy.
# Run: OPENBLAS_NUM_THREADS=1 python3 benches/peers/numpy_moons.py
import numpy as np, time
rng=np.random.default_rng(1)
n=400
t=np.linspace(0,np.pi,n//2)
x=np.concatenate([np.stack([np.cos(t),np.sin(t)],1),np.stack([1-np.cos(t),0.5-np.sin(t)],1)])+0.1*rng.standard_normal((n,2))
y=np.concatenate([-np.ones(n//2),np.ones(n//2)]).astype(np.float32)
x=x.astype(np.float32)
sizes=[2,16,16,1]
W=[(rng.uniform(-1,1,(a,b))*np.sqrt(6/a)).astype(np.float32) for a,b in zip(sizes,sizes[1:])]
B=[np.zeros(b,np.float32) for b in sizes[1:]]
VW=[np.zeros_like(w) for w in W]; VB=[np.zeros_like(b) for b in B]
lr,mu,wd=0.05,0.9,1e-4
t0=time.time()
for epoch in range(60):
    for i in range(0,n,20):
        xb=x[i:i+20]; yb=y[i:i+20,None]
        hs=[xb]
        h=xb
        for k in range(3):
            z=h@W[k]+B[k]
            h=np.maximum(z,0) if k<2 else z
            hs.append(h)
        m=1-yb*h
        loss=np.maximum(m,0).mean()
        g=np.where(m>0,-yb,0)/m.size
        for k in (2,1,0):
            gW=hs[k].T@g; gB=g.sum(0)
            if k>0:
                g=(g@W[k].T)*(hs[k]>0)
            VW[k]=mu*VW[k]+gW+wd*W[k]; VB[k]=mu*VB[k]+gB+wd*B[k]
            W[k]-=lr*VW[k]; B[k]-=lr*VB[k]
dt=time.time()-t0
print(f"numpy: 60 epochs x 20 batches in {dt*1e3:.1f} ms ({dt/1200*1e6:.1f} us/step), final loss {loss:.4f}")
