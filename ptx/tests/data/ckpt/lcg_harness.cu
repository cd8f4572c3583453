// GPU check of a preemptible kernel made by `ptx::ckpt::transform` (suite/kernels/lcg_spin.ptx):
// times the original and the transformed kernel (never preempted), then runs the transformed
// one with the flag raised from the host mid-kernel (device-memory flag, written on a second
// non-blocking stream) and relaunches it with __ck_resume = 1 until every record is done;
// the output must equal the original's bit for bit. Exit status 0 on a match.
//
//   cargo run -p ptx --example ckpt -- suite/kernels/lcg_spin.ptx > c.ptx   (prints "record 32")
//   nvcc -O2 -o lcg_harness ptx/tests/data/ckpt/lcg_harness.cu -lcuda
//   ./lcg_harness suite/kernels/lcg_spin.ptx c.ptx 32 20000
//
// Arguments: original PTX, transformed PTX, record bytes per thread, loop iterations.
// A host-mapped flag works too but every poll is then a PCIe read: far too slow.
#include <cuda.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <string>
#include <fstream>
#include <sstream>
#include <thread>
#include <chrono>
#define C(x) do{CUresult r_=(x);if(r_){const char*s_;cuGetErrorString(r_,&s_);printf("L%d %s\n",__LINE__,s_);exit(1);}}while(0)
static std::string rd(const char*p){std::ifstream f(p);std::stringstream s;s<<f.rdbuf();return s.str();}
static CUfunction load(const char*p){std::string t=rd(p);CUmodule m;
 C(cuModuleLoadData(&m,t.c_str()));CUfunction f;
 C(cuModuleGetFunction(&f,m,"lcg_spin"));return f;}
int main(int argc,char**argv){
 C(cuInit(0));CUdevice d;
 C(cuDeviceGet(&d,0));CUcontext cx;
 C(cuDevicePrimaryCtxRetain(&cx,d));
 C(cuCtxSetCurrent(cx));
 CUfunction fo=load(argv[1]),fc=load(argv[2]);unsigned rec=atoi(argv[3]),it=atoi(argv[4]),seed=7,G=1024,B=256,N=G*B;
 CUdeviceptr out,save;
 C(cuMemAlloc(&out,N*4));
 C(cuMemAlloc(&save,(size_t)N*rec));
 CUdeviceptr df;
 C(cuMemAlloc(&df,4));
 C(cuMemsetD32(df,0,1));CUstream s1,s2;
 C(cuStreamCreate(&s1,CU_STREAM_NON_BLOCKING));
 C(cuStreamCreate(&s2,CU_STREAM_NON_BLOCKING));setvbuf(stdout,0,_IONBF,0);
 unsigned res=0,dyn=0;void*ao[]={&out,&it,&seed};void*ac[]={&out,&it,&seed,&df,&save,&res,&dyn};
 CUevent e0,e1;
 C(cuEventCreate(&e0,0));
 C(cuEventCreate(&e1,0));
 for(int k=0;k<2;k++)for(int v=0;v<2;v++){float best=1e9;for(int r=0;r<5;r++){C(cuEventRecord(e0,0));
 C(cuLaunchKernel(v?fc:fo,G,1,1,B,1,1,0,0,v?ac:ao,0));
 C(cuEventRecord(e1,0));
 C(cuEventSynchronize(e1));float ms;
 C(cuEventElapsedTime(&ms,e0,e1));if(ms<best)best=ms;}if(k)printf("%s best %.3f ms\n",v?"ckpt":"orig",best);}
 std::vector<unsigned>ref(N),got(N),st(N*rec/4);
 C(cuMemcpyDtoH(ref.data(),out,N*4));
 C(cuMemsetD8(out,0,N*4));
 C(cuMemsetD8(save,0,(size_t)N*rec));
 for(int round=0;round<12;round++){C(cuMemsetD32(df,0,1));res=round>0;
 C(cuLaunchKernel(fc,G,1,1,B,1,1,0,s1,ac,0));
  if(round<8){std::this_thread::sleep_for(std::chrono::microseconds(300+round*700));
 C(cuMemsetD32Async(df,1,1,s2));
 C(cuStreamSynchronize(s2));}
  C(cuCtxSynchronize());
 C(cuMemcpyDtoH(st.data(),save,(size_t)N*rec));unsigned pend=0,saved=0;
  for(unsigned i=0;i<N;i++){unsigned s=st[i*rec/4];pend+=s!=0;saved+=s>=3;}
  printf("round %d: pending %u (saved at a point %u)\n",round,pend,saved);if(!pend)break;}
 C(cuMemcpyDtoH(got.data(),out,N*4));unsigned bad=0;for(unsigned i=0;i<N;i++)bad+=got[i]!=ref[i];
 printf("mismatches %u of %u\n",bad,N);return bad!=0;}
